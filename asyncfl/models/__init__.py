"""Model zoo: build a model by name for a dataset's input shape and classes."""

from asyncfl.models.zoo import MODELS, build_model, count_parameters

__all__ = ["MODELS", "build_model", "count_parameters"]
