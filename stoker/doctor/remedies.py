"""Remedies: stoker's own features, each with the code to paste and the img/s it is predicted to
give, every prediction a formula over figures measured on the sample (kept with the remedy, so
``--json`` shows the inputs and the arithmetic).

Pure functions of a :class:`~stoker.doctor.figures.Figures` record. Symbols in the formulas:

    S   storage as read now (cold random reads of loose files; sequential reads of shards)
    Q   storage after packing: the sample pack read front to back cold on the data's disk
    L   stoker.Loader on the sample pack, warm      Lc  the same, every pass read cold
    Lt  stoker.Loader with the transform's stages after the crop, warm
    G   stoker.Loader(decode="gpu") on the sample pack, warm
    D   the best DataLoader measured (warm)         C   the cores' decode + transform rate
    F0, F1  stoker's fused decode + crop per core, as stored / shrunk to the cap
    B   the bytes of the sample shrunk to the cap over its bytes as stored
    N   what the GPU consumes (batch / step time)   X   what input delivers now
    P   the object store with the proposed reads in flight (data at a URL)
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

from stoker.doctor.figures import Figures
from stoker.doctor.numbers import rounded
from stoker.doctor.remote_probe import size_words

# stoker.echo's default bound on how often one example is served.
ECHO_MAX_FACTOR = 4
UNMEASURED = ("; storage after packing was not measured (the sample was packed on another disk than the data's), so "
              "this assumes it is not the limit")
# A remedy is listed when predicted to beat what input delivers now by this factor.
WORTH = 1.05
# Inputs that are shares, not img/s.
_SHARES = {"B"}


@dataclass(frozen=True)
class Prediction:
    """``value`` = ``expression`` over ``inputs`` (symbol: (value, what was measured))."""

    expression: str
    inputs: Mapping[str, tuple[float | None, str]]
    value: float | None

    def in_words(self) -> str:
        """What the prediction comes from, each measured input named in words with its value: a
        user reads "predicted from: stoker.Loader on the sample pack, 1,500 img/s", not "= L, L 1,500"."""
        known = [(symbol, what, _amount(symbol, v)) for symbol, (v, what) in self.inputs.items() if v is not None]
        if len(known) == 1 and self.expression == known[0][0]:
            return f"predicted from: {known[0][1]}, {known[0][2]}"
        if self.expression == f"min({', '.join(symbol for symbol, _, _ in known)})":
            return "predicted from the lowest of: " + "; ".join(f"{what}, {amount}" for _, what, amount in known)
        return f"predicted as {self.expression}, where " + "; ".join(f"{symbol} = {what}, {amount}"
                                                                      for symbol, what, amount in known)

    def to_dict(self) -> dict:
        """The formula in the report: the expression, each input with what it measured, the result."""
        return {"expression": self.expression, "value": rounded(self.value),
                "inputs": {k: {"value": rounded(v, 1 if v is not None and abs(v) >= 10 else 4), "measured": what}
                           for k, (v, what) in self.inputs.items()}}


@dataclass(frozen=True)
class Remedy:
    """One thing to do, what it is predicted to give and how, and the exact command or code.
    ``needs``: what this machine lacks to predict it (then no number); ``trial``: what
    ``--prove`` runs for it (see stoker/doctor/prove.py), None where it cannot."""

    name: str
    prediction: Prediction
    how: str
    why: str
    trial: str | None = None
    needs: str | None = None

    @property
    def predicted_images_per_s(self) -> float | None:
        """The predicted img/s (None: not predicted here; ``needs`` says why)."""
        return self.prediction.value

    def to_dict(self) -> dict:
        """One entry of the report's remedy list."""
        return {"name": self.name, "predicted_images_per_s": rounded(self.predicted_images_per_s), "how": self.how,
                "why": self.why, "needs": self.needs, "trial": self.trial, "formula": self.prediction.to_dict()}


def remedies(f: Figures, delivered: float, cpu: float, needed: float | None) -> list[Remedy]:
    """Every remedy predicted to beat ``delivered`` by 5%, best first by predicted rate up to what
    the GPU consumes (beyond it more is worth nothing), then in the order written here; then
    those this machine cannot predict (a GPU remedy without a GPU); data echoing always last."""
    names = _Names(f)
    found = [_object_store(f, names), *_packing(f, names), *_staging(f, names), _gpu(f, names), _max_side(f, names),
             _workers(f, cpu)]
    out = [r for r in found if r is not None]
    cap = needed if needed is not None else math.inf
    rates = {id(r): rate for r in out if (rate := r.predicted_images_per_s) is not None and rate > WORTH * delivered}
    numbered = [r for r in out if id(r) in rates]
    ranked = sorted(numbered, key=lambda r: -min(rates[id(r)], cap))  # stable: ties stay in the order written
    return [*ranked, *(r for r in out if r.needs is not None), _echo(delivered, needed)]


class _Names:
    """Paths and code fragments the remedies' commands share."""

    def __init__(self, f: Figures) -> None:
        self.src = shlex.quote(f.source)
        stem = PurePath(f.source.rstrip("/")).name
        self.dst = f.source.rstrip("/") + "-shards" if f.loose else f.source
        self.shm = f"/dev/shm/{stem}-shards" if f.loose else f"/dev/shm/{stem}"
        self.pack = f"stoker pack {self.src} {shlex.quote(self.dst)}; then " if f.loose else ""
        crop = f"crop=stoker.CropSpec(size=({f.size}, {f.size}))"
        self.loader_args = f"{f.batch_size}, transform=train_transform" if f.user_transform else f"{f.batch_size}, {crop}"
        self.crop = crop

    def loader(self, root: str, extra: str = "") -> str:
        return f"stoker.Loader(stoker.ShardDataset({root!r}{extra}), {self.loader_args})"


def _packed_loader(f: Figures) -> Prediction | None:
    """stoker.Loader on the data packed (or on the packed data), storage included."""
    what = "on the sample pack"
    loader: tuple[str, float | None, str]
    if f.user_transform:
        if f.stoker_loader_transform is None:
            return None
        loader = ("Lt", f.stoker_loader_transform, f"stoker.Loader(transform=your pipeline), {what}, warm")
    else:
        loader = ("L", f.stoker_loader, f"stoker.Loader {what}, warm")
    if loader[1] is None:
        return None
    if f.stoker_loader_cold is not None:
        cold = ("Lc", f.stoker_loader_cold, f"stoker.Loader {what}, every pass read cold from the data's disk")
        return _min(loader, cold) if f.user_transform else _min(cold)
    return _min(loader, ("Q", f.sequential_rate, _sequential_what(f)))


def _packing(f: Figures, n: _Names) -> list[Remedy | None]:
    """stoker.Loader on packed data (with the user's transform when the Loader takes it), and for
    loose data, the shards in the user's own DataLoader."""
    out: list[Remedy | None] = []
    if f.object_store is not None:  # read in place, the object store is a term the Loader alone does not show
        return out
    loader = _packed_loader(f)
    unmeasured = UNMEASURED if f.loose and f.sequential_rate is None and f.stoker_loader_cold is None else ""
    if loader is not None:
        name = ("pack, then " if f.loose else "") + "stoker.Loader" + (" with your transform" if f.user_transform else "")
        out.append(Remedy(name, loader, n.pack + n.loader(n.dst),
                          "threads decode only each crop's rows, at a reduced DCT scale where the crop allows, into a "
                          "preallocated batch; measured: stoker.Loader on a pack of the sample" + unmeasured, trial="loader"))
    if f.loose:
        q = ("Q", f.sequential_rate, _sequential_what(f))
        d = ("D", f.loader_rate, f"the best DataLoader ({f.loader_workers} workers), warm")
        out.append(Remedy("pack, then ShardDataset in your DataLoader", _min(d, q),
                          f"stoker pack {n.src} {shlex.quote(n.dst)}; then train = stoker.ShardDataset({n.dst!r}, "
                          f"transform=train_transform); loader = torch.utils.data.DataLoader(train, batch_size={f.batch_size}, "
                          f"sampler=stoker.QuasiRandomSampler(train), num_workers={max(1, f.loader_workers)})",
                          "one large sequential read per block instead of a random read per file; your transform unchanged"
                          + unmeasured, trial="dataloader_packed"))
    return out


def _warm_loader(f: Figures) -> tuple[str, float | None, str]:
    """The stoker.Loader rate that bounds a remedy taking storage out of the loop, as a
    :func:`_min` term (symbol, img/s, what): with the user's transform when one was given."""
    if f.user_transform:
        return "Lt", f.stoker_loader_transform, "stoker.Loader with your transform, warm"
    return "L", f.stoker_loader, "stoker.Loader on the sample pack, warm (from RAM)"


def _staging(f: Figures, n: _Names) -> list[Remedy | None]:
    """Storage out of the loop: the data in RAM (stage, or the node cache), or on a local SSD."""
    loader = _warm_loader(f)
    if loader[1] is None or not (f.storage_rate < loader[1] or f.disk_shared) or f.object_store:
        return []  # data at a URL: the object-store remedy stages it (the node cache, with reads in flight)
    shared = "; the disk is shared with other jobs, which then no longer slow this one" if f.disk_shared else ""
    out: list[Remedy | None] = []
    if f.dataset_bytes < 0.5 * f.available_ram_bytes:
        stage = (f"stoker pack {n.src} {shlex.quote(n.shm)}" if f.loose else f"stoker stage {n.src} {shlex.quote(n.shm)}")
        out.append(Remedy("stage into RAM (/dev/shm) or the node cache", _min(loader),
                          f"{stage}; then {n.loader(n.shm)}   # or, reading in place: "
                          + n.loader(n.dst, ", cache_dir='/dev/shm/stoker'"),
                          f"the data set (~{f.dataset_bytes / 1e9:.1f} GB) fits in half the available RAM "
                          f"({f.available_ram_bytes / 1e9:.1f} GB): after the first pass storage leaves the loop{shared}",
                          trial="ram"))
    if f.ssd_path and f.ssd_copy_rate:
        ssd = shlex.quote(f"{f.ssd_path.rstrip('/')}/{PurePath(f.source.rstrip('/')).name}-shards")
        copy = ("R", f.ssd_copy_rate * 1e6 / max(1.0, f.mean_bytes), "copying onto the SSD, in images/s")
        command = f"stoker pack {n.src} {ssd}" if f.loose else f"stoker stage {n.src} {ssd}"
        out.append(Remedy("stage onto the local SSD", _min(loader, copy), f"{command}; then {n.loader(ssd)}",
                          f"copying onto it ran at {f.ssd_copy_rate:,.0f} MB/s; reads then come from the SSD{shared}"))
    return out


def _object_store(f: Figures, n: _Names) -> Remedy | None:
    """Data at a URL: read it with the proposed reads in flight through the node cache (whole
    shards staged ahead of the reader); loose files packed into shards first."""
    o = f.object_store
    loader = _warm_loader(f)
    if o is None or loader[1] is None:
        return None
    size = size_words(o.read_bytes)
    reads = f"{o.in_flight} read{'s' if o.in_flight != 1 else ''}"
    store = ("P", o.rate, f"the object store, {reads} of {size} in flight")
    if o.cache is None:
        return Remedy(f"pack into shards, then read them with {reads} in flight", _min(store, loader),
                      f"stoker pack LOCAL_COPY {n.src}-shards; then " + n.loader(
                          f"{f.source}-shards", f", cache_dir='/dev/shm/stoker', reads_in_flight={o.in_flight}"),
                      f"each loose file costs a request (first byte after {o.first_byte_ms:.0f} ms); shards are read "
                      f"in large pieces, and {o.in_flight} in flight measured {o.rate:,.0f} img/s even with whole files")
    limit = f", cache_limit={o.cache['cache_limit']}" if o.cache["cache_limit"] else ""
    later = (f"; later epochs read the node cache ({loader[1]:,.0f} img/s)" if o.cache["fits"]
             else "; the data set is larger than the cache: every epoch fetches each shard once")
    return Remedy(f"read through the node cache with {reads} of {size} in flight", _min(store, loader),
                  n.loader(f.source, f", cache_dir={o.cache['cache_dir']!r}{limit}, block_bytes={o.read_bytes}, "
                                     f"reads_in_flight={o.in_flight}"),
                  f"one read at a time waits {o.first_byte_ms:.0f} ms for each request's first byte; "
                  f"{reads} in flight filled the link as measured{later}")


def _gpu(f: Figures, n: _Names) -> Remedy | None:
    """Decode on the GPU with stoker.Loader(decode="gpu"), augment there with stoker.augment."""
    if f.jpeg_share < 0.5 or not math.isfinite(f.decode_per_core):
        return None
    code = (n.pack + f"loader = stoker.Loader(stoker.ShardDataset({n.dst!r}), {f.batch_size}, {n.crop}, decode='gpu'); "
            "augment = stoker.augment.Augment(stoker.augment.ColorJitter(0.4, 0.4, 0.4), stoker.augment.Normalize())"
            "   # your photometric ops, batched on the GPU: x = augment(images)")
    why = (f"the GPU decodes the JPEGs ({f.jpeg_share:.0%} of the images) and crops them; the CPU only reads bytes")
    if f.stoker_loader_gpu is None:
        return Remedy("decode on the GPU: stoker.Loader(decode='gpu') + stoker.augment", Prediction("G", {"G": (None, "")}, None),
                      code, why + "; not predicted: no GPU here", needs="a GPU")
    g = ("G", f.stoker_loader_gpu, "stoker.Loader(decode='gpu') on the sample pack, warm")
    storage = (("Lc", f.stoker_loader_cold, "stoker.Loader on the sample pack, every pass cold (reads included)")
               if f.stoker_loader_cold is not None else ("Q", f.sequential_rate, _sequential_what(f)))
    return Remedy("decode on the GPU: stoker.Loader(decode='gpu') + stoker.augment", _min(g, storage), code, why, trial="gpu")


def _max_side(f: Figures, n: _Names) -> Remedy | None:
    """Shrink large images at pack time: decode (and storage) cost follows the stored image. The
    Loader is timed on the sample shrunk as pack shrinks it: its per-image work besides decoding
    does not shrink with the pixels (scaling the Loader's rate by the decode speed-up alone
    predicted 3,344 img/s where 2,499 were measured)."""
    if f.stoker_loader_capped is None or f.capped_side is None:
        return None
    yours = " with your transform" if f.user_transform else ""
    inputs = {"L1": (f.stoker_loader_capped, f"stoker.Loader{yours} on the sample shrunk to {f.capped_side} px, warm")}
    expression, value = "L1", f.stoker_loader_capped
    if f.sequential_rate is not None and f.capped_bytes_share:
        inputs |= {"Q": (f.sequential_rate, _sequential_what(f)),
                   "B": (f.capped_bytes_share, f"bytes of the sample shrunk to {f.capped_side} px over its bytes as stored")}
        expression, value = "min(Q / B, L1)", min(f.sequential_rate / f.capped_bytes_share, value)
    src = n.src if f.loose else "SRC"
    return Remedy(f"cap the resolution at pack time (--max-side {f.capped_side}), then stoker.Loader",
                  Prediction(expression, inputs, value),
                  f"stoker pack {src} {shlex.quote(n.dst + f'-{f.capped_side}')} --max-side {f.capped_side}; then "
                  + n.loader(n.dst + f"-{f.capped_side}"),
                  f"the median image has {f.megapixels:.2f} MP; decode time follows the stored pixels", trial="max_side")


def _workers(f: Figures, cpu: float) -> Remedy | None:
    """A DataLoader using every core."""
    if f.loader_workers >= f.cores:
        return None
    limits = {"C": (cpu, f"{f.cores} cores' decode + transform"), "S": (f.storage_rate, "storage as read now")}
    limits = {k: v for k, v in limits.items() if math.isfinite(v[0])}  # a user's Dataset: storage not seen
    inputs = {**limits, "D": (f.loader_rate, f"the best DataLoader ({f.loader_workers} workers), warm")}
    scaled = f"D × {f.cores} / {max(1, f.loader_workers)}"
    value = min([v for v, _ in limits.values()] + [f.loader_rate * f.cores / max(1, f.loader_workers)])
    return Remedy(f"more DataLoader workers ({f.cores})",
                  Prediction(f"min({', '.join([*limits, scaled])})" if limits else scaled, inputs, value),
                  f"torch.utils.data.DataLoader(dataset, batch_size={f.batch_size}, num_workers={f.cores})",
                  f"the best measured loader used {f.loader_workers} workers on {f.cores} cores", trial="workers")


def _echo(delivered: float, needed: float | None) -> Remedy:
    """stoker.echo: always last, whatever it gives."""
    inputs = {"X": (delivered, "what input delivers now"), "N": (needed, "what the GPU consumes")}
    value = min(needed, ECHO_MAX_FACTOR * delivered) if needed is not None else None
    return Remedy("data echoing: stoker.echo", Prediction(f"min(N, {ECHO_MAX_FACTOR} × X)", inputs, value),
                  "batches = stoker.echo(loader)   # adaptive: an echo only while no fresh batch is ready",
                  "a last resort, listed last whatever its rate: the model sees examples more than once, which can "
                  "cost accuracy" + ("" if needed is not None else "; its rate depends on the step time (--step-time)"))


def _min(*terms: tuple[str, float | None, str]) -> Prediction:
    """``min`` of the measured terms (symbol, value, what); terms not measured (None) left out."""
    known = [(symbol, v, what) for symbol, v, what in terms if v is not None]
    value = min(t[1] for t in known)
    expression = known[0][0] if len(known) == 1 else f"min({', '.join(t[0] for t in known)})"
    return Prediction(expression, {t[0]: (t[1], t[2]) for t in known}, value)


def _amount(symbol: str, value: float) -> str:
    return f"{value:.0%}" if symbol in _SHARES else f"{value:,.0f} img/s"


def _sequential_what(f: Figures) -> str:
    return ("the sample pack read front to back cold on the data's disk" if f.loose
            else "the shards read front to back cold")
