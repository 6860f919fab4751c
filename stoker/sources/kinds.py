"""What kind of Python object a source is, recognized without importing the libraries it may come
from (pandas, pyarrow, Hugging Face ``datasets``, Ray), and the one-line refusal of what is not one.
"""

from __future__ import annotations

import sys
from typing import Any

# What stoker.pack takes, said in every refusal of something else.
PACK_TAKES = ("a folder of class folders, a CSV/TSV path list, Parquet or WebDataset .tar files, a Hugging Face "
              "Dataset (a DatasetDict with split=, or a save_to_disk folder), a pandas DataFrame, a pyarrow Table, "
              "or a map-style Dataset (__getitem__ and __len__)")


def _instance(obj: Any, module: str, *names: str) -> bool:
    """Whether ``obj`` is one of ``module``'s classes ``names``; False when the module was never
    imported (then the object cannot be one)."""
    loaded = sys.modules.get(module)
    return loaded is not None and any(isinstance(obj, cls) for n in names if isinstance(cls := getattr(loaded, n, None), type))


def table_kind(obj: Any) -> str | None:
    """``dataframe``, ``arrow_table``, ``hf_dataset`` or ``hf_dataset_dict`` for the tables stoker
    reads by column; None for anything else."""
    for module, name, kind in (("pandas", "DataFrame", "dataframe"), ("pyarrow", "Table", "arrow_table"),
                               ("datasets", "Dataset", "hf_dataset"), ("datasets", "DatasetDict", "hf_dataset_dict")):
        if _instance(obj, module, name):
            return kind
    return None


def not_a_source(obj: Any) -> str | None:
    """Why ``obj`` (not a path) cannot be packed, as ``what it is: what to do``; None for a table
    or a map-style Dataset (an object with ``__getitem__`` and ``__len__``)."""
    if table_kind(obj) is not None:
        return None
    if _instance(obj, "torch.utils.data", "DataLoader"):
        return "a torch DataLoader: pass its .dataset instead"
    if _instance(obj, "datasets", "IterableDataset", "IterableDatasetDict"):
        return ("a streaming Hugging Face dataset (no random access): load it without streaming=True, or save_to_disk "
                "and pass the folder")
    if type(obj).__module__.startswith("ray.data"):
        return ("a Ray Dataset: hand it over on Ray (docs/distributed.md), or write it as Parquet (ds.write_parquet) "
                "and pass the folder")
    if _instance(obj, "torch.utils.data", "IterableDataset"):
        return "an IterableDataset (no random access): pass a map-style Dataset, or the files it reads"
    if isinstance(obj, dict):
        return "a dict: for columns of images and labels pass pandas.DataFrame(it) or pyarrow.table(it)"
    if isinstance(obj, (bytes, bytearray)):
        return "bytes: give the source's path as a str or os.PathLike"
    if not (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")):
        return f"{described(obj)}, which has no __getitem__ and __len__"
    return None


def described(obj: Any) -> str:
    """``a <module>.<class>`` (``a str`` for built-in types), for messages."""
    kind = type(obj)
    return f"a {kind.__qualname__}" if kind.__module__ == "builtins" else f"a {kind.__module__}.{kind.__qualname__}"


def refusal(taker: str, why: str, takes: str) -> str:
    """The one line that refuses a source: ``taker`` got ``why``; what it takes."""
    return f"{taker} got {why}. It takes {takes}"
