"""rewrite's loggers as ``import rewrite`` leaves them.

rewrite logs under ``logging.getLogger("rewrite")`` (one child per module) and adds only a NullHandler: the
application decides where records go.

egglog logs every rule application at INFO (about 19,000 lines for a 2-layer MLP, 459,000 for the demo) under
its own loggers, drowning rewrite's report at `logging.basicConfig(level=INFO)` or `python -m rewrite -v`. They
start at WARNING unless the user has set a level on them; `logging.getLogger("egglog").setLevel(logging.INFO)`
before the first compile (or `python -m rewrite -vv`) shows them again.
"""
from __future__ import annotations

import logging

__all__ = ["EGGLOG_LOGGERS"]

EGGLOG_LOGGERS = ("egglog", "egglog.egraph")

logging.getLogger("rewrite").addHandler(logging.NullHandler())
for _name in EGGLOG_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.WARNING)
