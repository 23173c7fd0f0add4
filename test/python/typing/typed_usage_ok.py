"""Typical torch_monitor use, fully annotated: must pass `mypy --strict`
against the installed package (test_typing.py)."""

import datetime

import torch

import torch_monitor as tm

version: str = tm.__version__
path: str = tm.library_path

stat = tm.Stat("loss", [tm.MEAN, tm.MAX], datetime.timedelta(seconds=60))
stat.add(1.5)
stat.add(torch.tensor([1.0, 2.0]))
count: int = stat.count
values: dict[tm.Aggregation, float] = stat.get()
name: str = stat.name
steps = tm.IntStat("steps", [tm.SUM], datetime.timedelta(seconds=60))
int_values: dict[tm.Aggregation, int] = steps.get()

received: list[str] = []


def on_event(event: tm.Event) -> None:
    received.append(event.name)


handle: tm.EventHandlerHandle = tm.register_event_handler(on_event)
tm.set_step(3)
step: int | None = tm.get_step()
tm.unregister_event_handler(handle)

with tm.JsonLinesWriter("/dev/null", flush_interval=3600) as sink:
    problems: list[str] = sink.problems

event = tm.Event("e", datetime.datetime.now(), {"x": 1.0, "tag": "a"}, step=3)
x = event.data["x"]
if isinstance(x, float):
    loss: float = x
kinds: list[tm.WatchKind] = ["grad", "output"]
with tm.watch(torch.nn.Linear(2, 2), what=kinds, window_steps=10) as w:
    pass
