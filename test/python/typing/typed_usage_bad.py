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
