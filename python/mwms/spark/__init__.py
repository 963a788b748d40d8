"""Spark integration: run a training function on a Spark cluster's tasks wired together for
libmwms, with the API of ``spark_tensorflow_distributor.MirroredStrategyRunner``.

>>> from mwms.spark import MirroredStrategyRunner   # instead of spark_tensorflow_distributor's
>>> def train(steps):
...     import mwms.spark
...     strategy = mwms.spark.get_strategy()          # one worker of num_slots
...     ...                                           # strategy.all_reduce_gradients(...) per step
...     return weights                                # the chief's value is run()'s
>>> weights = MirroredStrategyRunner(num_slots=2).run(train, steps=100)

pyspark is needed for cluster mode (and for use_gpu in local mode) only. See docs/python.md,
"Spark".
"""
from ._runner import MirroredStrategyRunner, RemoteTraceback, TrainingError
from ._slot import get_strategy

__all__ = ["MirroredStrategyRunner", "RemoteTraceback", "TrainingError", "get_strategy"]
