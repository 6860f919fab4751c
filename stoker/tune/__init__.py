"""The Loader's pipeline model and its tuner's decisions: pure functions of measured figures,
shared by stoker.Loader (which measures itself while it runs) and stoker doctor (which measures
each stage alone). See model.py and tuner.py."""

from stoker.tune.estimate import Known, Window, estimate
from stoker.tune.model import Prediction, Source, Stages, choose, loader_choice, predict
from stoker.tune.settings import Bounds, Settings, loader_bounds, loader_start
from stoker.tune.tuner import Decision, Tuner

__all__ = ["Bounds", "Decision", "Known", "Prediction", "Settings", "Source", "Stages", "Tuner", "Window", "choose",
           "estimate", "loader_bounds", "loader_choice", "loader_start", "predict"]
