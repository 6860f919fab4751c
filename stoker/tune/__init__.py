"""The Loader's pipeline model and its tuner's decisions: pure functions of measured figures,
shared by stoker.Loader (which measures itself while it runs) and stoker doctor (which measures
each stage alone). See model.py and tuner.py."""

from stoker.tune.model import Prediction, Source, Stages, choose, loader_choice, predict
from stoker.tune.settings import Bounds, Settings, loader_bounds, loader_start

__all__ = ["Bounds", "Prediction", "Settings", "Source", "Stages", "choose", "loader_bounds", "loader_choice",
           "loader_start", "predict"]
