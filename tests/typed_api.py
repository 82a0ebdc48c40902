"""The public API used as the README shows, for ``mypy --strict`` (the lint environment).

Nothing here runs: each ``assert_type`` states the type a user's checker must see, and each
``# type: ignore[...]`` marks a call it must refuse (``--strict`` reports an ignore that is
not needed, so a hint that lets the wrong call through fails the check too).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List

import bcrecord
from bcrecord.analysis import Targets
from bcrecord.runtime import RecordError
from bcrecord.storage import saved_index, saved_keys

if TYPE_CHECKING:  # (torch is not needed: the torch layer is checked with its hints alone)
    import torch
    from typing_extensions import assert_type

    from bcrecord.torch import FeatureExtractor, ModelRecording, create_feature_extractor, record


class ToyModel:
    def __init__(self) -> None:
        self.scale = 3

    def forward(self, inputs: int) -> int:
        outputs = inputs + 1
        outputs = outputs * self.scale
        return outputs


def area(w: int, h: int) -> int:
    a = w * h
    return a


def work(count: int, label: str) -> float:
    return count / len(label)


def owner_of(model: ToyModel) -> str | None:
    return None if model.scale == 0 else "scaled"


def recordings_and_patches() -> None:
    model = ToyModel()
    with bcrecord.patch_method(model, "forward", ["outputs@1", "self.scale"], name="runner_model") as patch:
        assert_type(patch, bcrecord.Patch)
        with bcrecord.recording(keep="last") as rec:
            assert_type(rec, bcrecord.Recording)
            model.forward(1)
    assert_type(rec.all("runner_model:forward:outputs@1"), List[Any])
    assert_type(rec.keys(), List[str])
    assert_type(rec.errors, List[RecordError])
    assert_type(bcrecord.patch_function(area, "a"), bcrecord.Patch)
    # A per-instance name: a function of the instance giving the owner (None: not recorded).
    assert_type(bcrecord.patch_method(ToyModel, "forward", "outputs", name=owner_of), bcrecord.Patch)
    assert_type(bcrecord.instrument(ToyModel.forward, "outputs", name=owner_of)(model, 1), int)
    bcrecord.patch_method(ToyModel, "forward", "outputs", name=3)  # type: ignore[arg-type]
    assert_type(bcrecord.targets(ToyModel.forward), Targets)


def copies_keep_signatures() -> None:
    recorded = bcrecord.instrument(area, ["a", "return"])
    assert_type(recorded(2, 3), int)
    recorded("2", 3)  # type: ignore[arg-type]

    @bcrecord.record_locals("acc", index=[0, 2])
    def summed(values: List[int]) -> int:
        acc = 0
        for v in values:
            acc = acc + v
        return -acc

    assert_type(summed([1, 2]), int)
    summed(1)  # type: ignore[arg-type]

    @bcrecord.record_locals("y", index=range(2))  # any sequence of indices, as Local takes
    def negated(value: int) -> int:
        y = value
        y = -y
        return y

    assert_type(negated(1), int)

    carried = bcrecord.carry(work)
    assert_type(carried(1, "a"), float)
    carried(1, 2)  # type: ignore[arg-type]
    threading.Thread(target=bcrecord.carry(work), args=(1, "a")).start()
    assert_type(bcrecord.copy_value([1, 2], "clone"), List[int])


def saved_values(directory: str) -> None:
    copier: Callable[[ToyModel], ToyModel] = lambda model: model  # noqa: E731
    bcrecord.register_copy(ToyModel, "clone", copier)
    assert_type(bcrecord.load(directory)["k"], List[Any])
    assert_type(saved_keys(directory), List[str])
    assert_type(saved_index(directory), List[Dict[str, Any]])


def torch_layer(model: torch.nn.Module, batch: torch.Tensor) -> None:
    with record(model, ["0", ":forward:return"], keep=2) as rec:
        assert_type(rec, ModelRecording)
        model(batch)
    assert_type(rec.keys_of("0"), List[str])
    assert_type(rec.values_of("0"), Dict[str, List[Any]])

    @record(model, "0")  # as a decorator: each call records in a block of its own
    def evaluate(steps: int, label: str = "") -> List[float]:
        return [float(model(batch).sum()) for _ in range(steps)]

    assert_type(evaluate(2, label="a"), List[float])
    evaluate("2")  # type: ignore[arg-type]
    extractor = create_feature_extractor(model, {"0": "first"})
    assert_type(extractor, FeatureExtractor)
    assert_type(extractor(batch), Dict[str, Any])
