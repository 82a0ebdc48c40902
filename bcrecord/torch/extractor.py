"""Feature extraction without tracing: :func:`create_feature_extractor`, :func:`list_targets`.

A drop-in for ``torchvision.models.feature_extraction``: ``return_nodes`` takes
module paths (``'layer1'``) as torchvision does, and also any target of
:func:`bcrecord.torch.record` (``'layer1.0:forward:out@2'``, ``':_forward_impl:x@0'``).
Nothing is traced, so models with data-dependent control flow, ``assert`` or
``int(tensor)`` work; values are what the model computed (a module's output is
cloned before any in-place op downstream changes it).

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
>>> extractor = create_feature_extractor(net, {"1": "hidden"})
>>> extractor(torch.ones(3, 2))["hidden"].shape
torch.Size([3, 4])
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import operator
import sys
import types
import weakref
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

import torch

from ..analysis import returns_none
from ..errors import NotPatchableError, ReturnNodeError, SpecError, TargetError, did_you_mean, warn
from ..patch import Patch, remove_all, remove_soon
from ..patch import _lock as patch_lock
from ..patch import targets as function_targets
from ..runtime import carried_variable, kept_length
from ..specs import require_bool
from .copies import returned_inside
from .record import (
    PLAN_OPTIONS,
    ModelRecording,
    Pass,
    Plan,
    StopForward,
    _catching,
    _exporting,
    _stopping,
    broadcasts_buffers_next,
    threads_for,
    warn_shared,
)
from .targets import (
    Target,
    _expanding_again,
    _fx_leaf,
    _submodule,
    _torchvision_leaves,
    _warn,
    expand,
    fx_name_clash,
    has_forward,
    has_return,
    is_generator_function,
    is_python_method,
    named_modules,
    require_module,
    scripted,
    takes_instance,
    unwrap,
)

__all__ = ["FeatureExtractor", "create_feature_extractor", "list_targets", "TargetList"]

ReturnNodes = Union[Sequence[str], Mapping[str, str]]


def _normalise(
    model: torch.nn.Module, nodes: Optional[ReturnNodes], given: Optional[Dict[str, str]] = None
) -> Dict[str, str]:
    """``{concrete target: output name}``; globs expand in list form only. ``given`` is told
    the target as given of each a glob expanded to (``{'layer1': 'layer*'}``)."""
    if nodes is None:
        raise SpecError("return_nodes is required: module paths or targets, as a list or a dict")
    if not isinstance(nodes, (str, Mapping, list, tuple)):
        raise TypeError(
            f"return_nodes must be a list of module paths or targets, or a dict of them to output "
            f"names, got {type(nodes).__name__}"
        )
    out: Dict[str, str] = {}
    for target in [nodes] if isinstance(nodes, str) else nodes:
        # (not a submodule named 'grad', a ModuleDict's key: its path is its output)
        wants_grad = isinstance(target, str) and target.strip().endswith(".grad")
        if wants_grad and _submodule(model, target.strip()) is None:
            raise SpecError(
                f"{target!r}: an extractor returns its values when the forward ends, before any "
                "gradient exists; record gradients with bcrecord.torch.record()"
            )
    if isinstance(nodes, Mapping):
        for target, name in nodes.items():
            concrete = _expanded(model, target)
            if len(concrete) != 1:
                raise SpecError(f"{target!r} names {len(concrete)} targets; a dict entry needs exactly one")
            _warn_if_torchvision_differs(model, concrete[0])
            out[concrete[0].text] = str(name)  # (as torchvision's: {'layer1': 1} returns '1')
    else:
        for target in [nodes] if isinstance(nodes, str) else nodes:
            for one in _expanded(model, target):
                _warn_if_torchvision_differs(model, one)
                out[one.text] = one.text
                if given is not None and one.text != target:
                    given.setdefault(one.text, target)
    if not out:
        raise SpecError("return_nodes is empty")
    if len(set(out.values())) != len(out):
        raise SpecError(f"output names must be unique, got {list(out.values())}")
    return out


@contextlib.contextmanager
def _named_nothing() -> Iterator[None]:
    """A return node naming nothing refused as torchvision's extractor refuses it: the
    :class:`TargetError` raised inside as a ``ValueError`` too (:class:`ReturnNodeError`)."""
    try:
        yield
    except ReturnNodeError:
        raise
    except TargetError as error:
        raise ReturnNodeError(*error.args).with_traceback(error.__traceback__) from None


def _expanded(model: torch.nn.Module, target: str) -> List[Target]:
    """:func:`expand`, a target naming nothing refused as torchvision's extractor refuses it."""
    with _named_nothing():
        return expand(model, target)


#: The module classes the ``tracer_kwargs`` given to create_feature_extractor make FX leaves.
_leaf_modules: contextvars.ContextVar[Tuple[type, ...]] = carried_variable(
    contextvars.ContextVar("bcrecord_leaf_modules", default=())
)


def _warn_if_torchvision_differs(model: torch.nn.Module, target: Target) -> None:
    """Warn where a module path, named as such, is another op's node name for torchvision, or
    names a module with forward hooks (torchvision's node is what they return)."""
    if target.output and target.text == target.path and _warn.get():
        clash = fx_name_clash(model, target.path, _leaf_modules.get())
        if clash is not None:
            warn(
                f"return node {target.text!r} is a module path: bcrecord returns that module's output, "
                f"but {clash}"
            )
        module = _submodule(model, target.path)
        if module is not None and any(map(_may_replace_output, module._forward_hooks.values())):
            warn(
                f"return node {target.text!r}: the {type(module).__name__} there has forward hooks; "
                "bcrecord returns what its forward returns, before them, where torchvision's node is "
                "what they return (the same where they return None)"
            )


def _may_replace_output(hook: Callable[..., Any]) -> bool:
    """Whether a forward hook may return a value, which replaces the module's output; False
    for one that can only return None (transformers' ``output_hidden_states`` capture leaves
    such hooks on every layer it has collected from).

    >>> _may_replace_output(lambda module, args, output: output * 2)
    True
    >>> def collect(module, args, output):
    ...     outputs.append(output)
    >>> _may_replace_output(collect)
    False
    """
    function: Any = inspect.unwrap(hook)
    while isinstance(function, functools.partial):
        function = function.func
    code = getattr(function, "__code__", None)  # (a bound method's is its function's)
    return code is None or not returns_none(code)


#: A found output's place in the order of the forward (see FeatureExtractor.forward).
_position = operator.itemgetter(0)
_name_and_value = operator.itemgetter(1, 2)

#: Modules that torch runs as one fused op in eval mode without autograd, none of their Python code.
_FAST_PATH = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)


def _fast_path_hint(model: torch.nn.Module, plan: Plan, missing: Sequence[str], training: bool) -> str:
    """Why ``missing`` targets were not reached where a module around them took torch's fused
    fast path (``torch._transformer_encoder_layer_fwd``); '' where none can have.

    >>> import torch
    >>> layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    >>> plan = Plan(layer, ["linear1"])
    >>> with torch.no_grad():
    ...     print(_fast_path_hint(layer, plan, ["linear1"], training=False).split(", which")[0])
     (linear1 is inside the TransformerEncoderLayer at ''
    """
    if training or torch.is_grad_enabled():
        return ""
    for target in missing:
        for key in plan.keys.get(target, ()):
            path = key.rsplit(":", 2)[0]
            parts = path.split(".") if path else []
            for end in range(len(parts), -1, -1):  # (the innermost first)
                around = ".".join(parts[:end])
                module = _submodule(model, around)
                if isinstance(module, _FAST_PATH):
                    return (
                        f" ({target} is inside the {type(module).__name__} at {around!r}, which in eval "
                        "mode without autograd takes torch's fused fast path and runs none of its Python "
                        "code: call it with autograd on, or in train mode, or after "
                        "torch.backends.mha.set_fastpath_enabled(False))"
                    )
    return ""


def _holds_a_leaf_of_its_own(module: torch.nn.Module, leaves: Tuple[type, ...]) -> bool:
    """Whether ``module`` holds a module FX keeps whole that is no torch.nn module: one of
    ``torchvision.ops``' (its ``FeaturePyramidNetwork`` returns a dict) or of ``leaves``. Such a
    module's call may have made the container ``module`` returns (a detection model's
    ``BackboneWithFPN``), and torchvision's node is then that same container: no warning.

    >>> import torch
    >>> _holds_a_leaf_of_its_own(torch.nn.Sequential(torch.nn.ReLU()), ())
    False
    >>> _holds_a_leaf_of_its_own(torch.nn.Sequential(torch.nn.ReLU()), (torch.nn.ReLU,))
    True
    """
    ops = sys.modules.get("torchvision.ops")  # (not imported here: a model of its modules has)
    kinds = leaves + (_torchvision_leaves(ops) if ops is not None else ())
    return bool(kinds) and any([isinstance(inner, kinds) for inner in module.modules()])


def _uncalled_hint(model: torch.nn.Module, missing: Sequence[str]) -> str:
    """Why a module path among ``missing`` whose module has submodules may not be reached:
    its parent may call those one by one, or loop over them, and never the module itself
    (timm's ``forward_head`` calls ``head.global_pool`` … ``head.fc``); '' for none such.

    >>> import torch
    >>> head = torch.nn.Sequential()
    >>> head.pool, head.fc = torch.nn.Identity(), torch.nn.Linear(2, 2)
    >>> print(_uncalled_hint(torch.nn.Sequential(head), ["0"]).split(";")[0])
     (the Sequential at '0' was not called in this forward
    """
    for target in missing:
        module = _submodule(model, target) if ":" not in target else None
        children = [name for name, _ in module.named_children()] if module is not None else []
        if children:
            # (Which of them runs last, torchvision's node, is not known here: they are listed.)
            named = ", ".join(repr(f"{target}.{name}" if target else name) for name in children[:6])
            more = f" and {len(children) - 6} more" if len(children) > 6 else ""
            return (
                f" (the {type(module).__name__} at {target!r} was not called in this forward; a module "
                "path is the output of the module's own call, and a parent may call its submodules one "
                "by one or loop over them instead (as timm's forward_head calls head.global_pool … "
                f"head.fc): where they ran, torchvision's node {target!r} is the output of the last of "
                f"them that ran, which is a target here: one of {named}{more})"
            )
    return ""


_RUN_OPTIONS = ("keep", "threads")


#: A mode's plan, patches, idle recordings, and outputs (see FeatureExtractor._plans).
_ModePlan = Tuple[Plan, List[Patch], List[ModelRecording], List[Tuple[str, str, Tuple[str, ...], bool]]]
#: Why a call recorded nothing, where close() ran during it (another thread's, a hook's).
_CLOSED_DURING_THE_CALL = "this extractor was closed during the call, which took its patches out"
#: Held while an extractor makes a mode's plan and patches, or closes (rare: once per mode):
#: the patch lock itself, which patching and removing take inside it (a lock of its own, taken
#: before that one, deadlocked with a finalizer closing an extractor inside a patch's change).
_planning = patch_lock


class FeatureExtractor(torch.nn.Module):
    """Runs ``model`` and returns ``{name: value}`` for the requested targets.

    With ``stop_early`` (the default) the forward ends once every target has a
    value, like FX's dead-code elimination (not inside a ``DistributedDataParallel``
    while autograd is on: its gradients sync only after a whole forward, so that
    forward runs to its end; the values are the same; nor in the first forward without
    autograd after a training step, whose return turns off DDP's next broadcast of
    buffers; nor while forward hooks
    registered for every module, as ``FlopCounterMode``'s, or ``always_call=True``
    hooks of a module on the way to a target are there: they would be skipped; nor
    through a module whose ``forward`` is set on the instance, as accelerate's hooks set
    it: what that does after the class's forward, offloading the weights, would be (not
    ``torch.compile``'s, which only runs the forward it compiled); nor
    where a target naming several sites, a local without ``@index``, names one in a
    branch the model does not take: the stop waits for each, and a warning says so). A
    module path gives the module's output at its first call in the forward, as
    torchvision's node of that name (later calls are ``'relu_1'``…; torchvision's is
    another value where FX traces into a module whose forward returns a dict or list,
    which a warning says at the first call, or into one its parent never calls,
    calling its submodules instead: there the call's error lists them); an FX node name of
    an op (``'block.add'``) gives that op's value in the module's first run, as torchvision's
    (its later runs' are ``'block.add_1'``…, refused). Any other
    target recorded several times in one forward (a loop) gives the list of its
    values, in order (of a target naming several sites, each site's values in turn, ``keep``
    counting each site's), when the forward runs to its end (``stop_early=False``); with
    the early stop, its first, whatever else is asked for (a target naming several
    sites gives the first value of each, in a list). A list only where there are several
    values: a target recorded once in this call gives its value alone, so a site in a
    loop that ran once gives a tensor, and the same site gives a list when the loop ran
    twice (see :func:`create_feature_extractor`).
    A target the forward never reached raises an error naming it; so does one that a value
    of could not be recorded (its copy or ``reduce`` failed), though others came. The dict is in the
    order the forward first reached its targets (in the extractor's first call that
    reached each), as torchvision's follows the graph it traced once.

    The first call resolves the targets and patches the model's classes, in place
    (the first call in each mode, train / eval, where ``train_return_nodes`` and
    ``eval_return_nodes`` differ: switching modes then swaps code, which a compiled
    model recompiles for); later calls reuse that and only mark the targeted
    modules and enter a recording, itself reused from call to call (its routes to
    the probes are built once; its values are handed over and dropped each call).
    A patched method runs its original code whenever no recording takes its patch,
    and records only the marked modules, so the model behaves as before between
    calls. :meth:`close` (or garbage collection of the extractor) removes the
    patches; resolve again after changing the model's structure by making a new
    extractor. The extractor starts in the model's train / eval mode. Gradient
    targets (``'.grad'``) are refused: a call returns when its forward ends, before
    any gradient exists (record them with :func:`bcrecord.torch.record`). As with
    torchvision's extractor, features keep their autograd graph (``grad=False``
    detaches them, as ``copy='detach'`` does); they are clones, so an in-place op
    downstream never shows. Unlike
    torchvision's (a new module holding the model's submodules), it holds the model
    itself, as its submodule ``model``: its ``state_dict()`` keys start with ``model.``,
    so load a checkpoint of the model with ``extractor.model.load_state_dict(...)``.

    >>> import torch
    >>> from bcrecord.torch import FeatureExtractor
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    >>> extractor = FeatureExtractor(net, {"1": "hidden"})
    >>> sorted(extractor(torch.ones(4, 2)))
    ['hidden']
    >>> extractor(torch.ones(4, 2))["hidden"].shape
    torch.Size([4, 3])
    >>> extractor.close()
    """

    # What a call returns, for type checkers: nn.Module types every call as returning Any.
    __call__: Callable[..., Dict[str, Any]]
    #: (An extractor pickled by a bcrecord before it: a plan per mode.)
    _one_plan = False
    #: Module-path targets whose module FX traces into, not yet seen in a call's output.
    _traced_into: FrozenSet[str] = frozenset()

    def __init__(
        self,
        model: torch.nn.Module,
        return_nodes: Optional[ReturnNodes] = None,
        train_return_nodes: Optional[ReturnNodes] = None,
        eval_return_nodes: Optional[ReturnNodes] = None,
        stop_early: bool = True,
        **options: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(options) - set(PLAN_OPTIONS) - set(_RUN_OPTIONS))
        if unknown:
            # (record()'s stop_after_last is an extractor's stop_early)
            instead = "; an extractor's is stop_early=" if "stop_after_last" in unknown else ""
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)}; accepted: {', '.join(PLAN_OPTIONS + _RUN_OPTIONS)}"
                f"{instead}"
            )
        require_module(model)
        self.model = model
        if return_nodes is not None and (train_return_nodes is not None or eval_return_nodes is not None):
            raise SpecError("give return_nodes, or train_return_nodes and eval_return_nodes, not both")
        if return_nodes is None and (train_return_nodes is None) != (eval_return_nodes is None):
            missing = "eval_return_nodes" if eval_return_nodes is None else "train_return_nodes"
            raise SpecError(f"give train_return_nodes and eval_return_nodes together ({missing} is missing)")
        #: The glob each target expanded from was given as (a reduce dict may name it).
        self._globbed: Dict[str, str] = {}
        self.train_nodes = _normalise(
            model, train_return_nodes if return_nodes is None else return_nodes, self._globbed
        )
        with _expanding_again() if return_nodes is not None else contextlib.nullcontext():
            self.eval_nodes = _normalise(
                model, eval_return_nodes if return_nodes is None else return_nodes, self._globbed
            )
        self.stop_early = require_bool("stop_early", stop_early)
        # Module paths name a module's output as torchvision does: its first call in the
        # forward (FX names later calls 'relu_1', ...), with or without the early stop.
        with _expanding_again():  # (_normalise warned, once)
            self._first_only = frozenset(
                target
                for target in {**self.train_nodes, **self.eval_nodes}
                # A module path, or an FX node name (one op of the module's first run: FX
                # numbers the ops of its later runs on, 'block.add_1').
                if ":" not in target or all([one.output for one in expand(model, target)])
            )
        # Module paths whose module FX traces into (no leaf): where one returns a container,
        # torchvision's node of that path is another value (see _warn_of_containers). Not the
        # root's, '': torchvision has no such node (its graph's output is 'output').
        leaves = _leaf_modules.get()
        self._traced_into = frozenset(
            target
            for target in {**self.train_nodes, **self.eval_nodes}
            if target
            and ":" not in target
            and (module := _submodule(model, target)) is not None
            and not (_fx_leaf(module) or isinstance(module, leaves))
            and not _holds_a_leaf_of_its_own(module, leaves)
        )
        # As torchvision's: features stay in the autograd graph (a head trained on them
        # trains the backbone too); they are still copies, as assigned. grad=False detaches,
        # and so does copy='detach' given alone (with grad=True it keeps the tensor itself).
        self.options = {"grad": options.get("copy") != "detach", **options}
        # Every value of a call is kept until the call returns: a module path gives its
        # first call's output whatever ``keep`` says, which applies to the rest.
        self._kept = kept_length(options.get("keep", "all"))
        threads = threads_for(model, options.get("threads"))
        self._run_options: Dict[str, Any] = {"keep": "all", "threads": threads}
        # Every option checked now, not at the first call: plans made and dropped (nothing is
        # patched; the first call resolves the targets again, as documented).
        ModelRecording(**self._run_options)
        targeted: Dict[str, torch.nn.Module] = {}
        with _expanding_again():
            # Train's first (once if both are the same), not in a set's hash-seeded order.
            for nodes in dict.fromkeys([tuple(self.train_nodes), tuple(self.eval_nodes)]):
                with _named_nothing():  # (a site its method lacks: ':forward:zz')
                    targeted.update(self._new_plan(nodes).modules)
        warn_shared(model, targeted)
        #: Whether both modes take the same targets: one plan and patches serve both, so that a
        #: model switched between train and eval runs the same probed code (compiled graphs stay).
        self._one_plan = self.train_nodes == self.eval_nodes
        #: Per mode: its plan, patches, idle recordings, and what each call returns (target,
        #: name, its keys, first value only): one tuple, read at once (close() may clear it).
        self._plans: Dict[bool, _ModePlan] = {}
        # The model's mode, as torchvision's extractor starts; train() would set every submodule.
        self.training = model.training

    def _new_plan(self, nodes: Iterable[str]) -> Plan:
        """A plan of ``nodes`` with this extractor's options (resolves the targets, patches nothing)."""
        options = {k: v for k, v in self.options.items() if k in PLAN_OPTIONS}
        reduce = options.get("reduce")
        if isinstance(reduce, Mapping) and self._globbed:
            # A glob's entry, as record() takes it, for the targets it expanded to (each one's
            # own entry first): the plan is of those.
            nodes = list(nodes)
            options["reduce"] = {
                **{node: reduce[self._globbed[node]] for node in nodes if self._globbed.get(node) in reduce},
                **{key: value for key, value in reduce.items() if key not in self._globbed.values()},
            }
        return Plan(self.model, list(nodes), **options)

    def _plan(self, training: bool) -> _ModePlan:
        """The plan, patches, idle recordings and outputs of one mode (made at its first call):
        the same for both where they take the same targets."""
        found = self._plans.get(training or self._one_plan)
        return self._first_in_mode(training or self._one_plan) if found is None else found

    def _first_in_mode(self, training: bool) -> _ModePlan:
        """Make the plan, patches, idle recordings and outputs of one mode. Run eagerly under
        ``torch.compile`` (see :mod:`bcrecord.torch`): traced, a later mode's plan came out
        with the first mode's targets."""
        with _planning:  # (two threads' first calls patched twice, and close() kept one set)
            found = self._plans.get(training)
            if found is None:
                nodes = self.train_nodes if training else self.eval_nodes
                with _expanding_again():  # (the constructor warned)
                    plan = self._new_plan(nodes)
                plan.syncs  # noqa: B018 (found now, once: each call reads it, a compiled one too)
                patches = plan.patch(stops=self.stop_early)
                outputs = [
                    # The first value of each key with the early stop: what it guarantees,
                    # whatever else was asked for (a later target lets a loop run on).
                    (target, name, tuple(plan.keys[target]), self.stop_early or target in self._first_only)
                    for target, name in nodes.items()
                ]
                # Recordings between calls, reused so their routes and sinks are built once;
                # one per call running at the same time.
                found = self._plans[training] = (plan, patches, [], outputs)
                # Not a method: the finalizer must not keep the extractor alive.
                weakref.finalize(self, remove_soon, patches)
            return found

    def _new_recording(self, plan: Plan, patches: List[Patch]) -> ModelRecording:
        """A recording for one call at a time, kept between calls. Run eagerly under
        ``torch.compile``, as :meth:`_first_in_mode` (traced, Dynamo warned that it cannot
        trace the recording's lock)."""
        return plan.recording_for(patches, stop_after_last=self.stop_early, reused=True, **self._run_options)

    def _mode_hint(self, training: bool) -> str:
        """Why a target may not be reached in this mode, where one set of targets serves both.

        A detection model computes its losses in training only and its detections in
        eval only: a target in one of those branches is never reached in the other mode.
        That is one reason among others (a branch the input decides, a function not called),
        which the hint names first.
        """
        if self.train_nodes != self.eval_nodes:  # (targets given per mode already)
            return ""
        mode, other = ("train", "eval") if training else ("eval", "train")
        return (
            f" (in a branch it did not take, or a function it did not call; the model ran in {mode} "
            f"mode: a target in a branch only {other} mode takes is never reached in it; give the "
            "targets of each mode with train_return_nodes= and eval_return_nodes=)"
        )

    def close(self) -> None:
        """Remove the patches now (the next call patches again). Idempotent.

        >>> import torch
        >>> from bcrecord.torch import FeatureExtractor
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> extractor = FeatureExtractor(net, ["0"])
        >>> _ = extractor(torch.ones(1, 2))
        >>> extractor.close(); extractor.close()
        >>> sorted(extractor(torch.ones(1, 2)))  # patched again
        ['0']
        """
        with _planning:  # (a first call's plan made meanwhile, in another thread, goes too)
            plans = list(self._plans.values())
            self._plans.clear()
            for _, patches, _, _ in plans:
                remove_all(patches)

    def __getstate__(self) -> Dict[str, Any]:
        # Patches belong to this object; a copy (deepcopy, pickle) makes its own.
        state = self.__dict__.copy()
        state["_plans"] = {}
        return state

    def forward(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        """Run the model on ``args``/``kwargs``; ``{name: value}`` of every return node.

        >>> import torch
        >>> from bcrecord.torch import FeatureExtractor
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        >>> extractor = FeatureExtractor(net, {"0": "linear", "1": "relu"}, grad=False)
        >>> out = extractor(torch.tensor([[1.0, -1.0]]))
        >>> torch.equal(out["relu"], out["linear"].relu()), out["linear"].requires_grad
        (True, False)
        """
        training = self.training
        # Taken now, at once: close() meanwhile (another thread, a hook) clears them, and this
        # call's values are still this call's.
        plan, patches, idle, outputs = self._plan(training)
        try:
            rec = idle.pop()
        except IndexError:  # first call, or every recording is in a call in another thread
            if not all([patch.active for patch in patches]):  # closed by another thread since
                plan, patches, idle, outputs = self._plan(training)  # (patched again, as a next call)
            try:
                rec = self._new_recording(plan, patches)
            except SpecError:
                if all([patch.active for patch in patches]):
                    raise
                raise RuntimeError(_CLOSED_DURING_THE_CALL) from None  # (just now, by another thread)
        passing = Pass(plan, rec, stop_at_root=False)
        try:
            rec._start_pass()
            with passing:
                # Not inside DistributedDataParallel with autograd on (its gradients would not
                # sync) or where its return turns off its next broadcast of buffers, nor under
                # torch.export (its tracer loses track of the unwound calls).
                synced = plan.syncs and (torch.is_grad_enabled() or broadcasts_buffers_next(self.model))
                stops = self.stop_early and not synced and not _exporting()
                # Each variable set back in a finally of its own, opened before it is set: cut short
                # anywhere (what a signal handler raised, a Ctrl-C), none is left set.
                was_stopping, was_inside, catching = _stopping.get(), returned_inside.get(), _catching.get()
                try:
                    _stopping.set(stops)
                    try:
                        returned_inside.set(True)  # (inside torch.func.vmap: its outputs, batched)
                        try:
                            if stops:
                                _catching.set((*catching, (rec,)))
                            self.model(*args, **kwargs)
                            if stops:
                                rec._ran_whole()
                        except StopForward as stop:  # every target has its value
                            # Another's (an extractor further out), or one a caller further out ends too.
                            if rec not in stop.stops or stop._caught_further_out(catching):
                                raise
                        finally:
                            if stops:
                                _catching.set(catching)
                    finally:
                        returned_inside.set(was_inside)
                finally:
                    try:
                        _stopping.set(was_stopping)
                    finally:
                        rec._end_pass()
            # In the order the forward first reached them, as torchvision's (its graph's order);
            # list() first: a probe in another thread may add a key meanwhile.
            keys_reached = list(rec._data)
            reached = dict(zip(keys_reached, range(len(keys_reached)), strict=True))  # (no frame)
            end = len(reached)  # (a key another thread added since: after the rest)
            found: List[Tuple[int, str, Any]] = []
            missing = []
            failed = []
            rec._settle()  # (copies from a GPU without blocking: done before they are read)
            # A target one of whose values failed is failed, though others came: with the early
            # stop its first recorded value would be another call's (a loop's next turn), without
            # it its list short; either given as if whole.
            errored = {error.key for error in rec.errors} if rec.errors else ()
            for target, name, keys, first in outputs:
                values = rec._collect(keys, first, self._kept)
                if values and not (errored and any([key in errored for key in keys])):
                    # (One key, mostly: no generator for it, this runs on every call.)
                    if len(keys) == 1:
                        position = reached.get(keys[0], end)
                    else:
                        position = min(reached.get(key, end) for key in keys)
                    found.append((position, name, values[0] if len(values) == 1 else values))
                    continue
                errors = [e for e in rec.errors if e.key in plan.keys[target]]
                if errors:
                    failed.append(f"{target!r} ({type(errors[0].error).__name__}: {errors[0].error})")
                else:
                    missing.append(target)
        finally:
            if rec._token is not None or passing.marked:  # an interrupt kept the with from leaving
                passing.__exit__()
            rec._empty()  # the values are the caller's now; the extractor keeps none
            idle.append(rec)
        if failed:
            raise RuntimeError(f"this forward pass reached but could not record {', '.join(failed)}")
        if missing:
            replaced = [
                path for path, module in plan.modules.items() if _submodule(self.model, path) is not module
            ]
            # A method set on an instance since (a patch of that instance): runs instead of its class's.
            shadowed = sorted(
                {
                    f"the {method} of the module at {path or '<root>'!r}"
                    for target in missing
                    for path, method, _ in (key.rsplit(":", 2) for key in plan.keys.get(target, ()))
                    if path in plan.modules and method in getattr(plan.modules[path], "__dict__", {})
                }
            )
            edited = sorted({patch.function.__qualname__ for patch in patches if patch.stale})
            if not all([patch.active for patch in patches]):
                hint = f" ({_CLOSED_DURING_THE_CALL})"
            elif edited:
                hint = (
                    f" (the code of {', '.join(edited)} was set anew since this extractor patched it, as "
                    "IPython's autoreload does: close the extractor, extractor.close(), and call it again)"
                )
            elif replaced:
                hint = (
                    f" (the modules at {replaced} are not those this extractor resolved at its first "
                    "call: make a new extractor after changing the model)"
                )
            elif shadowed:
                hint = (
                    f" ({' and '.join(shadowed)} {'is' if len(shadowed) == 1 else 'are'} set on the "
                    "instance, by a patch of that module or an assignment, and runs instead of its "
                    "class's, which this extractor records: remove it)"
                )
            else:
                # (Both where both may be why: a module only one mode calls, GoogLeNet's aux1.)
                hint = _fast_path_hint(self.model, plan, missing, training) or (
                    self._mode_hint(training) + _uncalled_hint(self.model, missing)
                )
            raise RuntimeError(f"this forward pass never reached {missing}{hint}")
        if self._traced_into:  # (each such target's first value only: then empty)
            self._warn_of_containers(outputs, found)
        found.sort(key=_position)  # stable: return_nodes' order among equals
        return dict(map(_name_and_value, found))

    def _warn_of_containers(
        self, outputs: List[Tuple[str, str, Tuple[str, ...], bool]], found: List[Tuple[int, str, Any]]
    ) -> None:
        """Warn, once per target, where a module path's module, one FX traces into, returned a
        dict or list: FX makes no node of a container a forward builds, so torchvision's
        node of that path is the last op it traced inside the module (an FCN's
        ``IntermediateLayerGetter`` backbone: layer4's output, not the dict of it)."""
        values = {name: value for _, name, value in found}
        for target, name, _, _ in outputs:
            if target in self._traced_into and name in values:
                self._traced_into = self._traced_into - {target}
                value = values[name]
                # (Not a tuple: an op, torch.split, or a leaf's call, an LSTM's, returns one as one
                # node, which may be the last op traced inside; none returns a dict, hardly one a list.)
                if isinstance(value, (dict, list)):
                    module = _submodule(self.model, target)
                    warn(
                        f"return node {target!r} is a module path: bcrecord returns the "
                        f"{type(value).__name__} the forward of the {type(module).__name__} there "
                        "returns, but FX traces into that module and makes no node of a container "
                        f"its forward builds: torchvision's node {target!r} is the last op it traced "
                        "inside (name that op's module or site here, from list_targets)"
                    )


def create_feature_extractor(
    model: torch.nn.Module,
    return_nodes: Optional[ReturnNodes] = None,
    train_return_nodes: Optional[ReturnNodes] = None,
    eval_return_nodes: Optional[ReturnNodes] = None,
    tracer_kwargs: Optional[Dict[str, Any]] = None,
    suppress_diff_warning: bool = False,
    concrete_args: Optional[Dict[str, Any]] = None,
    *,
    stop_early: bool = True,
    **options: Any,
) -> FeatureExtractor:
    """An ``nn.Module`` whose forward returns ``{name: value}`` for ``return_nodes``.

    ``return_nodes`` is a list of targets (output names are the targets) or a dict
    ``{target: name}`` (a name that is no string is made one, as torchvision does:
    ``{'layer1': 1}`` returns ``'1'``); ``train_return_nodes``/``eval_return_nodes`` as in
    torchvision. Its tracing arguments, in its order: ``tracer_kwargs`` and
    ``suppress_diff_warning`` are taken and change nothing (nothing is traced, and
    there is no traced graph per mode to compare), but for ``tracer_kwargs``'s
    ``leaf_modules``, which the warnings that a module path names another node in
    torchvision heed (a leaf's node is its output); ``concrete_args`` is refused: it
    fixes arguments in the traced graph, where here each call's arguments are the
    forward's. Other keyword arguments (``copy``, ``to``, ``dtype``, ``reduce``,
    ``grad``, ``keep``, ``threads``) are :func:`bcrecord.torch.record`'s, except that
    ``grad`` defaults to True: features keep their autograd graph, as torchvision's do; and
    ``threads`` to ``'context'``, the call's own values (``'all'`` where the model holds an
    ``nn.DataParallel``, whose replicas run in threads of their own). The model's
    classes are patched in place at the first call and stay patched (running their
    original code whenever nothing records) until :meth:`FeatureExtractor.close`.

    Each value is what the target recorded in this call: a tensor (or whatever the
    site held) where it recorded one value, a list of them, in order, where it recorded
    several (a site inside a loop, with ``stop_early=False``; a target naming several
    sites). So the same site in a loop gives a tensor in a call whose loop ran once and
    a list in one whose loop ran more often: where the count varies, test
    ``isinstance(value, list)``, or name one iteration's site (``':forward:h@0'``).
    Values are copies (``copy='clone'``) unless ``copy='detach'`` or ``'none'`` says otherwise.

    >>> import torch
    >>> from bcrecord.torch import create_feature_extractor
    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(inplace=True))
    >>> feats = create_feature_extractor(net, ["0", "1"])(torch.randn(1, 1, 5, 5))
    >>> bool((feats["0"] < 0).any()), bool((feats["1"] >= 0).all())  # before / after the in-place ReLU
    (True, True)
    """
    require_bool("suppress_diff_warning", suppress_diff_warning, error=TypeError)  # (taken, as torchvision's)
    if tracer_kwargs is not None and not isinstance(tracer_kwargs, Mapping):
        raise TypeError(f"tracer_kwargs must be a dict or None, got {type(tracer_kwargs).__name__}")
    if concrete_args:  # (an empty dict fixes nothing)
        names = list(concrete_args) if isinstance(concrete_args, Mapping) else ["..."]
        call = ", ".join(["x", *(f"{name}=..." if name != "..." else name for name in names)])
        raise TypeError(
            "concrete_args fixes arguments for FX's trace, and nothing is traced here: the extractor "
            f"runs the model's forward with each call's arguments, so pass them there (extractor({call}))"
        )
    leaves = (tracer_kwargs or {}).get("leaf_modules") or ()
    if not isinstance(leaves, (list, tuple, set)) or not all([isinstance(kind, type) for kind in leaves]):
        raise TypeError(f"tracer_kwargs['leaf_modules'] must be a list of module classes, got {leaves!r}")
    # (they change which module paths torchvision names differently: the warnings say less)
    token = _leaf_modules.set(tuple(leaves))
    try:
        return FeatureExtractor(
            model, return_nodes, train_return_nodes, eval_return_nodes, stop_early, **options
        )
    finally:
        _leaf_modules.reset(token)


class TargetList(List[str]):
    """A list of target strings whose ``str`` is a table grouped by submodule."""

    #: What list_targets listed as paths only ('heads.task:cls:v2' with no target after it).
    _paths: FrozenSet[str] = frozenset()

    def __str__(self) -> str:
        lines: List[str] = []
        current = None
        for at, target in enumerate(self):
            # The path before the method and spec ('heads.task:cls:forward:return'); a bare
            # path is a module's whole path, also one with ':' in its name ('heads.task:cls'),
            # two too ('heads.task:cls:v2', its targets listed next).
            following = self[at + 1] if at + 1 < len(self) else ""
            bare = target.count(":") < 2 or following.startswith(f"{target}:") or target in self._paths
            path = target if bare else target.rsplit(":", 2)[0]
            if path != current:
                current = path
                lines.append(path or "<root>")
            if target != path:
                lines.append(f"    {target}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's and Jupyter's display: the grouped table of ``str``, not a flat list."""
        printer.text(str(self))


#: The methods :func:`list_targets` lists by default: those models are commonly recorded in.
_DEFAULT_METHODS = ("forward", "_forward_impl", "forward_features", "forward_head")


def list_targets(model: torch.nn.Module, methods: Union[str, Iterable[str]] = _DEFAULT_METHODS) -> TargetList:
    """Every recordable target per submodule, in module order (no tracing).

    For each submodule: its path (the module's output) and, for each of
    ``methods`` (a name, or several; by default ``forward``, ``_forward_impl``, ``forward_features`` and
    ``forward_head``) it defines in Python, one target per local assignment, attribute
    load site, call site (``'self.bn1()@0'``), operator site (``'+=@0'``) and return.
    TorchScript submodules, which cannot be recorded, are left out (a TorchScript model is
    refused), and so are sites
    inside a generator expression that does not use ``self`` (on 3.10/3.11 any
    comprehension): one patch of a class cannot tell its instances apart there. Methods
    given of which no submodule defines any in Python are an error (a misspelt name); among
    others that are defined, such a name adds nothing.

    >>> import torch
    >>> from bcrecord.torch import list_targets
    >>> targets = list_targets(torch.nn.Sequential(torch.nn.Linear(1, 1)))
    >>> targets[0], targets[-3:]
    ('', ['0:forward:self.weight@0', '0:forward:F.linear()@0', '0:forward:return'])
    """
    require_module(model)
    given = methods is not _DEFAULT_METHODS
    names = (
        [methods] if isinstance(methods, str) else list(methods) if isinstance(methods, Iterable) else None
    )
    if names is None or not all([isinstance(name, str) for name in names]):
        raise TypeError(f"methods is a method name or a list of them, got {methods!r:.80}")
    methods = names
    if isinstance(unwrap(model), torch.jit.ScriptModule):  # (its submodules, left out, are all there is)
        raise NotPatchableError(scripted(unwrap(model), ""))
    out = TargetList()
    paths: Set[str] = set()
    targets: Set[str] = set()
    defined = set()  # of methods, those some submodule defines in Python
    for path, module in named_modules(unwrap(model)):
        if isinstance(module, torch.jit.ScriptModule):
            continue  # TorchScript, not bytecode (its submodules are scripted too): not recordable
        forward: Any = getattr(type(module), "forward", None)
        # A container's path (ModuleList) has no output, nor has a forward that only raises; a
        # forward(*args), a static, class or builtin forward cannot be recorded here.
        if (
            has_forward(module)
            and is_python_method(type(module), "forward")
            and takes_instance(forward)
            and has_return(forward)
            and not is_generator_function(forward)
        ):
            out.append(path)
            paths.add(path)
        for method in methods:
            func: Any = getattr(type(module), method, None)
            if not is_python_method(type(module), method) or func is getattr(torch.nn.Module, method, None):
                continue
            defined.add(method)
            if not takes_instance(func):  # def forward(*args): record() refuses it, saying why
                continue
            listed = [f"{path}:{method}:{spec}" for spec in function_targets(func).specs(per_instance=True)]
            out.extend(listed)
            targets.update(listed)
    if given and methods and not defined:  # (a misspelt name listed the paths alone)
        python_methods = {
            name
            for module in unwrap(model).modules()
            for cls in type(module).__mro__[:-1]
            if cls is not torch.nn.Module
            for name, value in vars(cls).items()
            if isinstance(value, types.FunctionType)
        }
        raise TargetError(
            f"no submodule defines {' or '.join(map(repr, methods))} in Python"
            f"{did_you_mean(names[0], python_methods)}"
        )
    out._paths = frozenset(paths - targets)
    return out
