"""Training checkpoints: a model, its optimizer and scheduler in one ``.npz`` file.

``save_checkpoint(path, model=, optimizer=, scheduler=, epoch=, extra=)`` writes arrays
(the model's parameters and buffers under ``model/<name>``, the optimizer's state arrays
under ``optimizer/<index>/<name>``) and one JSON header (``__checkpoint__``: the format,
the kinds of optimizer and scheduler, the parameter names and shapes, the optimizer's
groups and scalar state, the scheduler's state, ``epoch`` and ``extra``). Nothing is
pickled: ``load_checkpoint`` reads with ``allow_pickle=False``, so a file can never run
code, and it checks the file against the objects it fills (names, shapes, kinds) before
writing into any of them, with an error naming what differs.

Resuming is exact: the numbers come back bit for bit and the optimizer's step counts as
ints, so training 3 steps, saving, loading into fresh objects and training 3 more gives
the parameters 6 uninterrupted steps give (``tests/test_training.py``).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import numpy as np

from easyad.nn._module import Module

__all__ = ["load_checkpoint", "save_checkpoint"]

FORMAT = "easyad-checkpoint-1"
HEADER = "__checkpoint__"


def _json_value(value: Any, where: str) -> Any:
    """``value`` as JSON can hold it (numbers keep int vs float; tuples become lists)."""
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _json_value(v, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"save_checkpoint: {where} is a {type(value).__name__}, which a "
                    f"checkpoint cannot hold (numbers, strings, lists and dicts only)")


def save_checkpoint(path: Any, model: Module | None = None, optimizer: Any = None,
                    scheduler: Any = None, epoch: int | None = None,
                    extra: dict[str, Any] | None = None) -> str:
    """Write ``model``'s parameters and buffers, ``optimizer``'s state and groups and
    ``scheduler``'s state (each optional) with ``epoch`` and ``extra`` (a dict of numbers,
    strings, lists) to ``path`` (``.npz`` added if missing), replacing it only once the
    new file is complete. Returns the path written."""
    target = str(os.fspath(path))
    if not target.endswith(".npz"):
        target += ".npz"
    arrays: dict[str, np.ndarray] = {}
    header: dict[str, Any] = {"format": FORMAT, "epoch": epoch,
                              "extra": _json_value(extra or {}, "extra")}
    if model is not None:
        if not isinstance(model, Module):
            raise TypeError(f"save_checkpoint: model is an nn.Module, not "
                            f"{type(model).__name__}")
        state = model.state_dict()
        header["model"] = {name: list(a.shape) for name, a in state.items()}
        arrays.update((f"model/{name}", a) for name, a in state.items())
    if optimizer is not None:
        header["optimizer"] = _optimizer_header(optimizer, arrays)
    if scheduler is not None:
        header["scheduler"] = {"kind": type(scheduler).__name__,
                               "state": _json_value(scheduler.state_dict(), "scheduler")}
    arrays[HEADER] = np.array(json.dumps(header))
    folder = os.path.dirname(os.path.abspath(target))
    handle, temporary = tempfile.mkstemp(suffix=".npz", dir=folder)
    try:
        with os.fdopen(handle, "wb") as f:
            savez: Any = np.savez        # its stub reserves the keyword allow_pickle
            savez(f, **arrays)
        os.replace(temporary, target)
    except BaseException:
        os.unlink(temporary)
        raise
    return target


def _optimizer_header(optimizer: Any, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    saved = optimizer.state_dict()
    scalars: dict[str, dict[str, Any]] = {}
    for index, entries in saved["state"].items():
        for name, value in entries.items():
            if isinstance(value, np.ndarray):
                arrays[f"optimizer/{index}/{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = _json_value(
                    value, f"optimizer state {name!r} of parameter {index}")
    return {"kind": type(optimizer).__name__,
            "shapes": [list(p.shape) for p in optimizer.parameters],
            "param_groups": _json_value(saved["param_groups"], "optimizer param_groups"),
            "scalars": scalars}


def _read(path: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except ValueError as error:           # an object array: refused, never unpickled
        raise ValueError(f"load_checkpoint: {path} holds pickled objects, which a "
                         f"checkpoint never does; not loaded ({error})") from None
    if HEADER not in arrays:
        raise ValueError(f"load_checkpoint: {path} is not an easyad checkpoint (no "
                         f"{HEADER} entry; a model's own file loads with model.load)")
    header = json.loads(str(arrays.pop(HEADER)))
    if header.get("format") != FORMAT:
        raise ValueError(f"load_checkpoint: {path} has format {header.get('format')!r}, "
                         f"this easyad reads {FORMAT!r}")
    return header, arrays


def load_checkpoint(path: Any, model: Module | None = None, optimizer: Any = None,
                    scheduler: Any = None) -> dict[str, Any]:
    """Load what ``save_checkpoint`` wrote into ``model``, ``optimizer`` and ``scheduler``
    (each optional; made as for the saved run), after checking the file against them.
    Returns ``{"epoch": ..., "extra": {...}}``. Make the scheduler before loading, as for
    PyTorch: its construction sets the learning rates that the optimizer's state then
    restores."""
    header, arrays = _read(path)
    known = {k for k in arrays if k.startswith(("model/", "optimizer/"))}
    if known != set(arrays):
        raise ValueError(f"load_checkpoint: unexpected entries {sorted(set(arrays) - known)}")
    wanted = [(name, obj) for name, obj in (("model", model), ("optimizer", optimizer),
                                             ("scheduler", scheduler)) if obj is not None]
    for name, _ in wanted:
        if name not in header:
            raise ValueError(f"load_checkpoint: {path} holds no {name} (it has "
                             f"{[k for k in ('model', 'optimizer', 'scheduler') if k in header]})")
    # every check before anything is written
    model_state = None
    if model is not None:
        model_state = {name[len("model/"):]: a for name, a in arrays.items()
                       if name.startswith("model/")}
        if sorted(model_state) != sorted(header["model"]):
            raise ValueError("load_checkpoint: the file's model entries differ from its "
                             "header; the file is damaged")
        own = model.state_dict()
        missing, unexpected = sorted(set(own) - set(model_state)), \
            sorted(set(model_state) - set(own))
        if missing or unexpected:
            raise KeyError(f"load_checkpoint: the model differs from the saved one: missing "
                           f"{missing}, unexpected {unexpected}")
        for name, a in model_state.items():
            if a.shape != own[name].shape:
                raise ValueError(f"load_checkpoint: {name} has shape {a.shape} in the file, "
                                 f"{own[name].shape} in the model")
    optimizer_state = None
    if optimizer is not None:
        optimizer_state = _optimizer_state(header["optimizer"], arrays, optimizer)
    if scheduler is not None and header["scheduler"]["kind"] != type(scheduler).__name__:
        raise TypeError(f"load_checkpoint: the file holds a {header['scheduler']['kind']}'s "
                        f"state, the scheduler given is a {type(scheduler).__name__}")
    if model is not None:
        model.load_state_dict(model_state)
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
        for group, saved in zip(optimizer.param_groups, header["optimizer"]["param_groups"]):
            for key, value in saved.items():    # tuples (betas) come back as tuples
                if isinstance(value, list) and key != "params":
                    group[key] = tuple(value)
    if scheduler is not None:
        scheduler.load_state_dict(header["scheduler"]["state"])
    return {"epoch": header["epoch"], "extra": header["extra"]}


def _optimizer_state(saved: dict[str, Any], arrays: dict[str, np.ndarray],
                     optimizer: Any) -> dict[str, Any]:
    """The optimizer's ``state_dict`` from the file, checked against ``optimizer``."""
    if saved["kind"] != type(optimizer).__name__:
        raise TypeError(f"load_checkpoint: the file holds a {saved['kind']}'s state, the "
                        f"optimizer given is a {type(optimizer).__name__}")
    shapes = [list(p.shape) for p in optimizer.parameters]
    if len(shapes) != len(saved["shapes"]):
        raise ValueError(f"load_checkpoint: the saved optimizer had {len(saved['shapes'])} "
                         f"parameters, this one has {len(shapes)}")
    for i, (a, b) in enumerate(zip(saved["shapes"], shapes)):
        if a != b:
            raise ValueError(f"load_checkpoint: optimizer parameter {i} had shape "
                             f"{tuple(a)}, here {tuple(b)}")
    sizes = [len(g["params"]) for g in saved["param_groups"]]
    if sizes != [len(g["params"]) for g in optimizer.param_groups]:
        raise ValueError(f"load_checkpoint: the saved optimizer's parameter groups hold "
                         f"{sizes} parameters, this one's "
                         f"{[len(g['params']) for g in optimizer.param_groups]}")
    state: dict[int, dict[str, Any]] = {}
    for name, a in arrays.items():
        if name.startswith("optimizer/"):
            _, index, key = name.split("/", 2)
            if not index.isdigit() or int(index) >= len(shapes):
                raise ValueError(f"load_checkpoint: optimizer entry {name!r} names no "
                                 f"parameter of the {len(shapes)}")
            state.setdefault(int(index), {})[key] = a
    for index, entries in saved["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    return {"state": state, "param_groups": saved["param_groups"]}

