"""Mistakes mypy must find in torch_monitor code (test_typing.py): each line
marked `# error:` gives one error, and no other line does."""

import datetime

import torch_monitor as tm

stat = tm.Stat("loss", [tm.MEAN], datetime.timedelta(seconds=60))
count: str = stat.count  # error: an int, not a str
stat.add_sample(1.0)  # error: no such method
values: dict[str, float] = stat.get()  # error: keys are Aggregation
version: int = tm.__version__  # error: the version is a str
tm.set_step("3")  # error: the step is an int or None
sink = tm.JsonLinesWriter("/dev/null")
problems: int = sink.problems  # error: a list of messages
event = tm.Event("e", 0.0, {"x": 1.0})  # error: a datetime, not a float
x: float = event.data["x"]  # error: a value may be a str
tm.register_event_handler(42)  # error: a callable or a sink
model = __import__("torch").nn.Linear(2, 2)
tm.watch(model, writer=42)  # error: a TensorBoardWriter or None
tm.watch(model, what=("activations",))  # error: not a kind
