"""bcrecord.torch.targets: parsing and expanding target strings over a model."""

import copy
import functools
import operator
import warnings
from fnmatch import fnmatchcase
from typing import Tuple

import pytest
import torch

import bcrecord
import bcrecord.torch
from bcrecord import Local, Return
from bcrecord.torch.targets import expand, expand_all, module_at, named_modules, new_matches, unwrap

from .models import CallsMap, SmallNet


def test_forms():
    net = SmallNet()
    (t,) = expand(net, "blocks.1:forward:out@2")
    assert (t.path, t.method, t.spec, t.grad, t.output) == (
        "blocks.1",
        "forward",
        Local("out", 2),
        False,
        False,
    )
    (t,) = expand(net, ":forward:x@0")
    assert (t.path, t.spec) == ("", Local("x", 0))
    (t,) = expand(net, "bn1")
    assert (t.spec, t.output, t.text) == (Return(), True, "bn1")
    (t,) = expand(net, "blocks.0:forward:out@1.grad")
    assert t.grad and t.text == "blocks.0:forward:out@1"


def test_spaces_around_a_target_s_parts_are_read_as_bcrecord_run_reads_them():
    net = SmallNet()
    (t,) = expand(net, " blocks.1 : forward : out@2 ")
    assert (t.path, t.method, t.spec, t.text) == (
        "blocks.1",
        "forward",
        Local("out", 2),
        "blocks.1:forward:out@2",
    )
    with bcrecord.torch.record(net, ["blocks.1 : forward : out@2"]) as rec:
        net(torch.ones(2, 3, 8, 8))
    assert list(rec) == ["blocks.1:forward:out@2"]


@pytest.mark.parametrize(
    "typo, meant",
    [
        ("blocks.0.forward:out", "; did you mean 'blocks.0:forward:out'?"),
        ("blocks.0:out@1", "; did you mean 'blocks.0:forward:out@1'?"),
        ("forward:x", "; did you mean ':forward:x'?"),  # (was 'forward:forward:x', refused in turn)
        # A name the module holds (each was told '<path>:forward:<name>', refused in turn).
        ("blocks.0:bn", "; did you mean 'blocks.0.bn' (its output)?"),
        ("blocks.0.conv:weight", "; did you mean 'blocks.0.conv:forward:self.weight' (the parameter, as "),
        ("bn1:running_mean", "; did you mean 'bn1:forward:self.running_mean' (the buffer, as forward "),
        (
            "blocks.0:forward",
            "; did you mean 'blocks.0:forward:return' (what forward returns) or 'blocks.0' (its ",
        ),
        ("blocks.0\uff1aforward\uff1aout", "it has full-width characters: write 'blocks.0:forward:out'"),
        ("blocks.0:forward:out\uff201", "it has full-width characters: write 'blocks.0:forward:out@1'"),
        ("blocks.0:forward:out@01", "bad index in 'out@01': a leading zero is not accepted: write 'out@1'"),
        (":forward:x@[0,02]", "a leading zero is not accepted: write 'x@[0,2]'"),
    ],
)
def test_a_target_with_a_likely_typo_is_told_the_form_to_write(typo, meant):
    with pytest.raises(bcrecord.SpecError) as caught:
        expand(SmallNet(), typo)
    assert meant in str(caught.value)
    # A full-width letter is a letter of the name, as the compiler reads it.
    (target,) = expand(SmallNet(), "blocks.0:forward:\uff4f\uff55\uff54@1")
    assert target.spec == Local("out", 1)


@pytest.mark.parametrize(
    "typo, meant",
    [
        # '.grad' kept (the hint recorded the value), a container's children (it has no output).
        ("blocks.0.conv:weight.grad", "'blocks.0.conv:forward:self.weight.grad' (the parameter"),
        ("blocks.0:bn.grad", "'blocks.0.bn:forward:return.grad' (the gradient of its output)"),
        (":stages", "'stages.*' (its submodules' outputs)"),
        (":scales", "':forward:self.scales' (the ParameterList, as forward reads it)"),
        (":nested", "'nested.**' (its submodules' outputs)"),  # (containers only: 'nested.*' matched none)
    ],
)
def test_a_two_part_target_is_told_a_form_that_is_accepted(typo, meant):
    net = SmallNet()
    net.stages = torch.nn.ModuleList([torch.nn.ReLU()])
    net.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(1))])
    net.nested = torch.nn.ModuleList([torch.nn.ModuleList([torch.nn.ReLU()])])
    with pytest.raises(bcrecord.SpecError) as caught:
        expand(net, typo)
    assert f"; did you mean {meant}" in str(caught.value)
    assert expand(net, meant.split("'")[1])


def test_a_two_part_target_in_a_torchscript_module_is_told_the_form_without_a_crash():
    # The hint read the module's tables as dicts: "'OrderedModuleDict' object has no attribute 'get'".
    net = SmallNet()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.jit.script is deprecated)
        net.fc = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 5)))
    with pytest.raises(bcrecord.SpecError, match=r"; did you mean 'fc:forward:weight'\?$"):
        expand(net, "fc:weight")


class _Indexed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer1 = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        self.blocks = torch.nn.ModuleDict({"a": torch.nn.Linear(2, 2)})
        self.stages = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(4)])


@pytest.mark.parametrize(
    "indexed, dotted",
    [
        ("layer1[0]:forward:x", "layer1.0"),
        ("stages[3]", "stages.3"),
        ("stages[-1]:forward:input@0", "stages.3"),
        ("blocks['a']", "blocks.a"),
        ('blocks["a"]:forward:input', "blocks.a"),
        ("stages[*]", "stages.*"),
    ],
)
def test_a_child_written_with_an_index_is_told_its_dotted_path(indexed, dotted):
    # Was "no submodule matches 'layer1[0]'": the '[' read as a glob's, and nothing more said.
    model = _Indexed()
    with pytest.raises(bcrecord.TargetError) as caught:
        expand(model, indexed)
    assert str(caught.value) == (
        f"no submodule matches {indexed.split(':')[0]!r}: a child (a Sequential's, a ModuleList's, "
        f"a ModuleDict's) is named with a dot, not indexed: {dotted!r}"
    )
    assert expand(model, dotted)[0].path.startswith(dotted.rstrip("*"))
    # A subscript that names no child either is no hint; a glob's class still matches.
    with pytest.raises(bcrecord.TargetError, match=r"^no submodule matches 'stages\[7\]'$"):
        expand(model, "stages[7]")
    assert [t.path for t in expand(model, "stages.[03]")] == ["stages.0", "stages.3"]


@pytest.mark.parametrize(
    "path, kind, target",
    [
        ("layer1.0.weight", "a parameter", "layer1.0:forward:self.weight"),
        ("norm.running_mean", "a buffer", "norm:forward:self.running_mean"),
        # (self.params[0] is read by a subscript: no target names it)
        (
            "params.0",
            "a parameter",
            "no method its module's forward runs reads it: record a value made from it",
        ),
    ],
)
def test_a_parameter_s_path_as_a_target_is_told_the_target_that_reads_it(path, kind, target):
    # Was "no submodule 'layer1.0.weight'; nor is 'weight' an FX name of a call or operator site...".
    class Net(_Indexed):
        def forward(self, x):
            return self.norm(self.layer1(x)) * self.params[0]

    model = Net()
    model.norm = torch.nn.BatchNorm1d(2)
    model.params = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(2))])
    with pytest.raises(bcrecord.TargetError) as caught:
        expand(model, path)
    assert str(caught.value).startswith(f"{path!r} is {kind}, not a submodule: ")
    assert str(caught.value).endswith(target if " " in target else f"is {target!r}")
    if " " not in target:
        with bcrecord.torch.record(model, [target]) as rec:
            model(torch.ones(3, 2))
        assert torch.equal(rec[target], model.get_parameter(path) if "weight" in path else torch.zeros(2))


@pytest.mark.parametrize(
    "path, close",
    [("blocks.", "'blocks.0', 'blocks', 'blocks.0.0'"), ("blocks.0.", "'blocks.0.0', 'blocks.0'")],
)
def test_a_path_ending_in_a_dot_is_told_the_paths_close_to_it_not_an_empty_fx_name(path, close):
    # Was "... did you mean ...? Nor is '' an FX name of a call or operator site of
    # Sequential.forward ...": the empty part after the dot, taken for an FX node's name.
    model = torch.nn.Sequential()
    model.add_module("blocks", torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU())))
    with pytest.raises(bcrecord.TargetError) as caught:
        expand(model, path)
    assert str(caught.value) == f"the model has no submodule {path!r}; did you mean {close}?"


def test_a_slice_in_a_module_path_is_told_the_children_or_glob_to_write():
    with pytest.raises(bcrecord.SpecError) as caught:
        expand(_Indexed(), "stages[0:2]")
    assert str(caught.value) == (
        "bad target 'stages[0:2]': a module path takes no slice: name each child ('stages.0') "
        "or match them with a glob ('stages.*', 'stages.[01]')"
    )


def test_a_slice_that_a_glob_would_read_as_a_character_class_is_refused_too():
    # '[0:2]' on a Sequential recorded layers 0 and 2 ('0', ':' and '2' as a glob's class), and
    # 'blocks.[1:]' layer 1 alone; a slice of the root's children was told '.0', refused too.
    model = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(4)])
    for text in ("[0:2]", "[1:]:forward:input"):
        with pytest.raises(bcrecord.SpecError) as caught:
            expand(model, text)
        assert str(caught.value) == (
            f"bad target {text!r}: a module path takes no slice: name each child ('0') "
            "or match them with a glob ('*', '[01]')"
        )
    with pytest.raises(bcrecord.SpecError, match=r"name each child \('blocks.0'\)"):
        expand(torch.nn.ModuleDict({"blocks": model}), "blocks.[1:]")
    keyed = torch.nn.ModuleDict({"a:b": torch.nn.ReLU(), "c": torch.nn.ReLU()})  # (a name with a ':')
    assert [t.path for t in expand(keyed, "[a:]*")] == ["a:b"]


def test_a_tensor_path_is_told_a_target_that_records_it_where_its_forward_names_self_otherwise():
    # Was 'odd:forward:self.w' (refused: Odd.forward has no argument 'self'), and for a tensor of
    # a plain holder module, "no method ... reads it" where its parent's forward reads self.inner.w.
    class Odd(torch.nn.Module):
        def __init__(this) -> None:
            super().__init__()
            this.w = torch.nn.Parameter(torch.ones(2))

        def forward(this, x):
            return x * this.w

    class Holding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Module()
            self.inner.w = torch.nn.Parameter(torch.full((2,), 2.0))
            self.odd = Odd()

        def forward(self, x):
            return self.odd(x) * self.inner.w

    model = torch.nn.Sequential(Holding())
    told = {}
    for path in ("0.odd.w", "0.inner.w"):
        with pytest.raises(bcrecord.TargetError) as caught:
            expand(model, path)
        told[path] = str(caught.value).rsplit(" ", 1)[1].strip("'")
    assert told == {"0.odd.w": "0.odd:forward:this.w", "0.inner.w": "0:forward:self.inner.w@0"}
    with bcrecord.torch.record(model, list(told.values())) as rec:
        model(torch.ones(2))
    assert [rec[target].tolist() for target in told.values()] == [[1.0, 1.0], [2.0, 2.0]]


def test_a_submodule_whose_name_has_full_width_punctuation_is_still_a_target():
    # Every target with a full-width '（' was refused as an IME's typo, a module named so too:
    # 'blk（1）:forward:h' recorded before the refusal came in.
    model = torch.nn.ModuleDict({"blk\uff081\uff09": torch.nn.Linear(2, 2)})
    (target,) = expand(model, "blk\uff081\uff09:forward:input@0")
    assert (target.path, target.spec) == ("blk\uff081\uff09", Local("input", 0))
    with pytest.raises(bcrecord.SpecError, match="write 'blk\uff081\uff09:forward:input@0'"):
        expand(model, "blk\uff081\uff09:forward:input\uff200")  # (its spec's '＠' is still a typo)


def test_globs_match_one_component_at_a_time():
    net = SmallNet()
    assert [t.path for t in expand(net, "blocks.*")] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [t.path for t in expand(net, "blocks.*.bn")] == ["blocks.0.bn", "blocks.1.bn", "blocks.2.bn"]
    assert [t.text for t in expand(net, "blocks.[01]:forward:out@0")] == [
        "blocks.0:forward:out@0",
        "blocks.1:forward:out@0",
    ]


def test_a_double_star_part_of_a_glob_matches_any_number_of_path_parts():
    # '**' was fnmatch's '*' for one part: '**.bn' matched nothing ("no submodule matches"),
    # '**' alone only the root's children, as in pathlib's globs it is any number of parts.
    net = SmallNet()
    bns = ["blocks.0.bn", "blocks.1.bn", "blocks.2.bn"]
    assert [t.path for t in expand(net, "**.bn")] == bns
    assert [t.path for t in expand(net, "blocks.**.bn")] == bns
    assert [t.path for t in expand(net, "**.bn1")] == ["bn1"]  # none too: a root's child
    assert [t.path for t in expand(net, "**")] == [name for name, _ in net.named_modules() if name]
    assert [t.path for t in expand(torch.nn.DataParallel(net), "**.bn")] == bns  # the model's paths
    assert [t.path for t in expand(net, "bl**.0")] == ["blocks.0"]  # 'bl**' is one part's glob
    with pytest.raises(
        bcrecord.TargetError, match=r"'blokcs' names no submodule there; did you mean 'blocks'"
    ):
        expand(net, "blokcs.**.bn")
    with torch.no_grad(), bcrecord.torch.record(net, ["**.bn", "blocks.*.bn"]) as rec:
        net(torch.randn(1, 3, 4, 4))
    assert sorted(rec.keys()) == [f"{path}:forward:return" for path in bns]  # each module once
    assert rec["blocks.0.bn:forward:return"].shape == (1, 4, 4, 4)
    model, x, inner = _compiled_in_the_middle()  # a compiled block's children at its path
    assert [t.path for t in expand(model, "**.0")] == ["0", "1.0"]
    assert [t.path for t in expand(model, "**._orig_mod")] == ["1._orig_mod"]  # as named_modules() names it


def test_many_double_stars_in_a_glob_are_matched_in_one_pass_with_the_same_results(monkeypatch):
    # Each '**' tried every split of the path in turn: 'a.**.**.….x' against a path with no 'x'
    # took time exponential in the number of '**' (30 of them: hours).
    from bcrecord.torch import targets

    def reference(parts, wanted):  # the definition: '**' takes any number of whole parts
        if not wanted:
            return not parts
        if wanted[0] == "**":
            return any(reference(parts[k:], wanted[1:]) for k in range(len(parts) + 1))
        return bool(parts) and fnmatchcase(parts[0], wanted[0]) and reference(parts[1:], wanted[1:])

    paths = [[], ["a"], ["a", "b"], ["a", "b", "a"], ["b", "a", "c", "a"], ["a", "x", "b"]]
    globs = ["**", "**.a", "a.**", "**.a.**", "a.**.a", "**.**.b", "*.**.a", "**.*.**", "a**", "**.x.**.b"]
    for path in paths:
        for glob in globs:
            assert targets._parts_match(path, glob.split(".")) is reference(path, glob.split(".")), (
                path,
                glob,
            )
    compared = []
    monkeypatch.setattr(
        targets.fnmatch, "fnmatchcase", lambda part, glob: compared.append(part) or part == glob
    )
    wanted = ["a"] + ["**"] * 30 + ["x"]
    assert targets._parts_match(["a"] * 30, wanted) is False
    assert len(compared) <= 30 * len(wanted)  # (before: more than 2**30)


def test_a_glob_on_a_wrapped_model_matches_the_model_s_submodules_and_a_real_name_is_no_glob():
    net = SmallNet()
    wrapped = torch.nn.DataParallel(net)
    assert [t.path for t in expand(wrapped, "blocks.*")] == ["blocks.0", "blocks.1", "blocks.2"]
    assert [t.path for t in expand(wrapped, "*")] == [name for name, _ in net.named_children()]
    assert [t.path for t in expand(wrapped, "module.blocks.*")][0] == "module.blocks.0"  # through it
    named = torch.nn.Module()
    named.add_module("blk0", torch.nn.Linear(2, 2))
    named.add_module("blk[0]", torch.nn.Linear(2, 3))  # a name with a glob's characters in it
    assert [t.path for t in expand(named, "blk[0]")] == ["blk[0]"]
    assert [t.path for t in expand(named, "blk[01]")] == ["blk0"]  # a glob where no name is that


def test_a_glob_that_matches_nothing_names_its_first_part_that_matches_nothing_also_after_a_star():
    # Only a part before the first '*' was looked at: 'blocks.*.bnn' and 'blcks*.0' said
    # "no submodule matches" and nothing more.
    net = SmallNet()
    expected = {
        "blocks.*.bnn": "('bnn' names no submodule there; did you mean 'bn'?)",
        "*.[0-9].bnn": "('bnn' names no submodule there; did you mean 'bn'?)",
        "blcks*.0": "('blcks*' matches no submodule there; there: 'stem', 'bn1', 'relu', 'blocks', 'fc')",
        "blocks.[5-9]": "('[5-9]' matches no submodule there; there: '0', '1', '2')",
        "blocks.*.bn.x": "('x' names no submodule there)",  # (bn has no children)
        "blocks.**.bnn": "",  # (after a '**', where a part falls is not one place)
    }
    for glob, hint in expected.items():
        with pytest.raises(bcrecord.TargetError) as error:
            expand(net, glob)
        assert str(error.value) == f"no submodule matches {glob!r}" + (f" {hint}" if hint else "")


def test_a_glob_that_matches_nothing_in_a_wrapped_model_names_the_misspelt_part_of_the_model_s_paths():
    # Under nn.DataParallel or torch.compile's wrapper the hint read the wrapper's paths
    # ('module.blocks'): 'blocks.*.bnn' said "'blocks' names no submodule there", though the
    # model has 'blocks', and 'blokcs.*' lost its "did you mean 'blocks'".
    import torch._dynamo

    net = SmallNet()
    for wrapped in (net, torch.nn.DataParallel(net), torch.compile(net, backend="eager")):
        with pytest.raises(bcrecord.TargetError) as error:
            expand(wrapped, "blocks.*.bnn")
        assert str(error.value) == (
            "no submodule matches 'blocks.*.bnn' ('bnn' names no submodule there; did you mean 'bn'?)"
        )
        with pytest.raises(
            bcrecord.TargetError, match=r"\('blokcs' names no submodule there; did you mean 'blocks'\?\)"
        ):
            expand(wrapped, "blokcs.*")
    with pytest.raises(
        bcrecord.TargetError, match=r"\('blokcs' names no submodule there; did you mean 'blocks'\?\)"
    ):
        expand(torch.nn.DataParallel(net), "module.blokcs.*")
    torch._dynamo.reset()


def test_a_glob_through_a_block_compiled_in_place_that_matches_nothing_names_the_part_that_does_not():
    # A glob may name torch.compile's wrapper of a block compiled in place ('blocks.*._orig_mod.*'
    # matches): the hint read only the paths that see through it, and blamed '_orig_mod'.
    import torch._dynamo

    net = SmallNet()
    net.blocks[0] = torch.compile(net.blocks[0], backend="eager")
    assert [t.path for t in expand(net, "blocks.*._orig_mod.b*")] == ["blocks.0._orig_mod.bn"]
    with pytest.raises(bcrecord.TargetError) as error:
        expand(net, "blocks.*._orig_mod.bnn")
    assert str(error.value) == (
        "no submodule matches 'blocks.*._orig_mod.bnn' ('bnn' names no submodule there; did you mean 'bn'?)"
    )
    torch._dynamo.reset()


def test_wrappers_and_errors():
    net = SmallNet()
    assert unwrap(torch.nn.DataParallel(net)) is net
    assert module_at(torch.nn.DataParallel(net), "blocks.0") is net.blocks[0]
    with pytest.raises(bcrecord.SpecError, match="follows a target with its method"):
        expand(net, "bn1.grad")
    with pytest.raises(bcrecord.SpecError, match="must be a string"):
        expand(net, 3)
    with pytest.raises(TypeError, match="expected an nn.Module instance, got int"):  # (was an AttributeError)
        expand(3, "0")
    # '' is the root, as list_targets lists it, also inside a wrapper
    (root,) = expand(net, "")
    assert (root.path, root.method, root.output) == ("", "forward", True)
    wrapped = torch.nn.DataParallel(net)
    assert module_at(wrapped, "") is net and expand(wrapped, ":forward:x@0")[0].path == ""


def test_fx_node_names_count_ops_in_the_order_they_run():
    # As FX names them: add (x + 1), add_1 (torch.add), add_2 (b + 100); mul, mul_1.
    from bcrecord.torch import create_feature_extractor

    class Adds(torch.nn.Module):
        def forward(self, x):
            a = x + 1
            b = torch.add(a, 10)
            c = b.mul(2)
            d = torch.mul(c, 3) + 100
            return d

    features = create_feature_extractor(Adds(), ["add", "add_1", "add_2", "mul", "mul_1"])(torch.zeros(1))
    assert {name: value.item() for name, value in features.items()} == {
        "add": 1.0,
        "add_1": 11.0,
        "add_2": 166.0,
        "mul": 22.0,
        "mul_1": 66.0,
    }


def test_an_fx_name_whose_site_depends_on_a_branch_is_refused_with_the_sites_to_pick():
    # As RegNet's ResBottleneckBlock: FX's 'add' is whichever '+' the branch taken runs.
    from bcrecord.torch import create_feature_extractor

    class Block(torch.nn.Module):
        def __init__(self, proj):
            super().__init__()
            self.proj = torch.nn.Identity() if proj else None

        def forward(self, x):
            if self.proj is not None:
                x = self.proj(x) + 1
            else:
                x = x + 2
            return x

    net = torch.nn.Sequential(Block(True), Block(False))
    message = r"'1.add': Block has 2 'add' sites and not all of them run together \(a branch decides\)"
    with pytest.raises(bcrecord.TargetError, match=message) as error:
        create_feature_extractor(net, ["1.add"])
    assert "'1:forward:+@0', '1:forward:+@1'" in str(error.value)
    features = create_feature_extractor(net, ["1:forward:+@1"])(torch.zeros(1))
    assert features["1:forward:+@1"].item() == 3.0  # (0 + 1) + 2


def test_an_fx_name_of_a_site_before_a_guarded_one_maps_and_one_a_branch_may_shift_is_refused():
    # As FCN's and DeepLabV3's heads: 'interpolate' is the first F.interpolate whether or not
    # the aux branch runs (it was refused: not all sites run together); as Conv3d's
    # _conv_forward, a site a branch may skip still leaves FX's first name undecided.
    from bcrecord.torch import create_feature_extractor

    class Head(torch.nn.Module):
        def __init__(self, aux):
            super().__init__()
            self.aux = torch.nn.Identity() if aux else None

        def forward(self, x):
            out = torch.mul(x, 2) + 1
            if self.aux is not None:
                out = out + torch.mul(self.aux(x), 10)
            return out

    class Conv(torch.nn.Module):
        def __init__(self, pad):
            super().__init__()
            self.pad = pad

        def forward(self, x):
            if self.pad:
                return torch.mul(x, 3)
            return torch.mul(x, 5)

    net = torch.nn.Sequential(Head(True), Head(False), Conv(False))
    names = ["0.mul", "0.mul_1", "0.add", "0.add_1", "1.mul", "1.add"]
    features = create_feature_extractor(net, names)(torch.ones(1))
    assert {name: value.item() for name, value in features.items()} == {
        "0.mul": 2.0,
        "0.add": 3.0,
        "0.mul_1": 10.0,
        "0.add_1": 13.0,
        "1.mul": 26.0,
        "1.add": 27.0,
    }
    with pytest.raises(bcrecord.TargetError, match=r"'2.mul': Conv has 2 'mul' sites and not all"):
        create_feature_extractor(net, ["2.mul"])
    with pytest.raises(bcrecord.TargetError, match=r"'2.mul_1': Conv has 2 'mul' sites and not all"):
        create_feature_extractor(net, ["2.mul_1"])
    # (FX has no '1.mul_1' in this model: the branch it is in does not run there.)
    with pytest.raises(RuntimeError, match=r"never reached \['1.mul_1'\]"):
        create_feature_extractor(net, ["1.mul_1"])(torch.ones(1))


def test_an_fx_name_after_an_early_return_in_a_method_fx_traces_into_is_refused():
    # _main's early return skips its interpolate with no jump around it, while forward's go
    # on: with fast set, FX's 'interpolate_1' is forward's second (x4); it was mapped to its
    # first (x3), as if _main's always ran ('interpolate' to _main's, which then never runs).
    from bcrecord.torch import create_feature_extractor

    class Net(torch.nn.Module):
        def __init__(self, fast):
            super().__init__()
            self.fast, self.aux = fast, True

        def _main(self, x):
            if self.fast:
                return x
            return torch.nn.functional.interpolate(x, scale_factor=2.0)

        def forward(self, x):
            y = self._main(x)
            if self.aux:
                z = torch.nn.functional.interpolate(x, scale_factor=3.0)
                return y, z, torch.nn.functional.interpolate(x, scale_factor=4.0)
            return y

    class Plain(Net):  # (no branch in forward: its sites and _main's had the same guards)
        def forward(self, x):
            y = self._main(x)
            return y, torch.nn.functional.interpolate(x, scale_factor=3.0)

    for net in (Net(True), Plain(True)):
        for name in ("interpolate", "interpolate_1"):
            with pytest.raises(bcrecord.TargetError, match="not all of them run together"):
                create_feature_extractor(net, [name])


def test_a_forward_replaced_on_the_instance_is_the_one_recorded_or_refused():
    import functools

    class Alt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.forward = self.forward_fast

        def forward(self, x):
            y = self.lin(x)
            return y

        def forward_fast(self, x):
            y = self.lin(x) * 2
            return y

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Alt())
    (output,) = expand(model, "1")  # the module's output: what the method that runs returns
    assert (output.method, output.output) == ("forward_fast", True)
    with pytest.warns(
        bcrecord.RecordingWarning, match="it runs forward_fast: its targets are '1:forward_fast:...'"
    ):
        (local,) = expand(model, "1:forward:y")
    assert local.method == "forward"  # as asked: forward_fast might call it
    model[0].forward = functools.partial(lambda x: x)
    with pytest.warns(
        bcrecord.RecordingWarning, match="has its own forward attribute; Linear.forward records only if"
    ) as caught:
        (other,) = expand(model, "0")
    assert other.method == "forward"
    assert caught[0].filename == __file__  # the line that asked, not bcrecord's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with bcrecord.torch.record(model, ["0"]):
            pass
        bcrecord.torch.create_feature_extractor(model, ["0"])  # expands per mode: warns once
    assert [(w.filename, w.category) for w in caught] == [(__file__, bcrecord.RecordingWarning)] * 2
    # accelerate's hooks: a partial that names the method it wraps, and changes what it returns
    hooked = torch.nn.Sequential(torch.nn.Linear(2, 2))
    bound = hooked[0].forward
    hooked[0].forward = functools.update_wrapper(
        functools.partial(lambda m, x: bound(x) * 3, hooked[0]), bound
    )
    with pytest.warns(
        bcrecord.RecordingWarning, match="Linear at '0' has its own forward attribute"
    ) as caught:
        expand(hooked, "0")
    # It names the wrapper, what the path records, and where the wrapper's value is.
    assert "(it is functools.partial(tests.torch.test_targets." in str(caught[0].message)
    assert "the path records Linear.forward's return, not what that returns to its caller" in str(
        caught[0].message
    )
    assert "record where the caller takes it (':forward:<local>'" in str(caught[0].message)
    with pytest.warns(bcrecord.RecordingWarning) as caught:
        expand(hooked, "0:forward:input")  # a site inside Linear.forward: it runs, or not
    assert "(it is functools.partial(" in str(caught[0].message) and "the path" not in str(caught[0].message)
    outer = torch.nn.Sequential(torch.nn.Linear(2, 2))
    outer.forward = functools.partial(torch.nn.Sequential.forward, outer)
    with pytest.warns(bcrecord.RecordingWarning, match=r"for that value, take what model\(...\) returns"):
        expand(outer, "")


def test_an_fx_name_in_a_function_that_loops_is_refused_with_the_sites_to_pick():
    # FX numbers the ops of each turn: 'add_1' is the loop's second turn, not the second site.
    from bcrecord.torch import create_feature_extractor

    class Looped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])

        def forward(self, x):
            for layer in self.layers:
                x = x + layer(x)
            x = x + 1
            return x

    for name in ("add", "add_1", "add_2"):
        with pytest.raises(bcrecord.TargetError, match=f"'{name}': Looped runs 'add' in a loop") as error:
            create_feature_extractor(Looped(), [name])
        assert "':forward:+@0', ':forward:+@1'" in str(error.value)
    turns = create_feature_extractor(Looped(), [":forward:+@0"], stop_early=False)(torch.ones(1))
    assert [t.item() for t in turns[":forward:+@0"]] == [2.0, 4.0]


def test_fx_names_in_a_wrapped_forward_are_checked_in_the_function_inside():
    # transformers' gradient checkpointing wraps every layer's forward in a wrapper with a
    # branch; a loop or a branch is that of the function the sites are in, not the wrapper's.
    from bcrecord.torch import create_feature_extractor

    def passing(func):
        @functools.wraps(func)
        def wrapper(self, *args):
            return func(self, *args)

        return wrapper

    def branching(func):
        @functools.wraps(func)
        def wrapper(self, *args):
            if getattr(self, "checkpointing", False):  # as transformers' checkpointing wrapper:
                message = "checkpointing " + type(self).__name__  # a '+' FX does not number
                args = tuple(args) + (message,)
            return func(self, *args)

        return wrapper

    class Looped(torch.nn.Module):
        @passing
        def forward(self, x):
            for _ in range(3):
                x = x + 1
            return x

    class Straight(torch.nn.Module):
        @branching
        def forward(self, x):
            y = x + 1
            z = y + 2
            return z

    with pytest.raises(bcrecord.TargetError, match="'add': Looped runs 'add' in a loop"):
        create_feature_extractor(Looped(), ["add"])
    assert create_feature_extractor(Straight(), ["add_1"])(torch.zeros(1))["add_1"].item() == 3.0


def test_containers_and_methods_that_do_not_run_on_the_module_are_explained():
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    holder = Holder()
    with pytest.raises(bcrecord.TargetError, match=r"ModuleList at 'blocks' has no forward of its own"):
        expand(holder, "blocks")
    holder.named = torch.nn.ModuleDict({"first": torch.nn.ReLU()})
    holder.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(1))])
    with pytest.raises(bcrecord.TargetError, match=r"target its submodules \('named.first', 'named.\*'\)"):
        expand(holder, "named")  # its own names, not '.0'
    with pytest.raises(
        bcrecord.TargetError, match=r"holds no submodules: record where what it holds is used"
    ):
        expand(holder, "scales")
    assert [t.path for t in expand(holder, "blocks.*")] == ["blocks.0", "blocks.1"]
    with pytest.raises(bcrecord.TargetError, match=r"'\*' matches only containers"):
        expand(holder, "*")

    class Static(torch.nn.Module):
        @staticmethod
        def forward(x):
            return x

    class Classy(torch.nn.Module):
        @classmethod
        def forward(cls, x):
            return x

    for kind, model in (("staticmethod", Static()), ("classmethod", Classy())):
        with pytest.raises(bcrecord.NotPatchableError, match=f"forward is a {kind}, which does not run on"):
            expand(model, "")

    class Builtin(torch.nn.Module):
        forward = torch.relu

    # A glob skips them, as list_targets leaves them out: '*' was refused as a whole for one of them.
    model = torch.nn.Sequential(Static(), torch.nn.Identity(), Classy(), Builtin())
    assert [t.path for t in expand(model, "*")] == ["1"]
    assert [t for t in bcrecord.torch.list_targets(model) if t and t[0] in "023"] == []
    with pytest.raises(bcrecord.NotPatchableError, match="has no Python method 'forward'"):
        expand(model, "3")
    with pytest.raises(bcrecord.TargetError, match=r"'\[023\]' matches only .* static, class or builtin"):
        expand(model, "[023]")
    lam = torch.nn.Module()
    lam.forward = lambda x: x * 2
    with pytest.raises(bcrecord.NotPatchableError, match="runs a forward set on the instance"):
        expand(lam, "")

    class Star(torch.nn.Module):
        def forward(*args):  # no instance to tell the modules of one patch apart
            y = args[1] * 3
            return y

    model = torch.nn.Sequential(torch.nn.Identity(), Star())
    assert [t.path for t in expand(model, "*")] == ["0"]  # a glob skips it, as a container
    for target in ("1", "1:forward:y"):
        with pytest.raises(
            bcrecord.NotPatchableError, match=r"forward takes no positional argument.*on the instance"
        ):
            expand(model, target)
    assert [t for t in bcrecord.torch.list_targets(model) if t.startswith("1")] == []  # not offered
    with bcrecord.patch_method(model[1], "forward", "y", name="star"), bcrecord.recording() as rec:
        model(torch.ones(1))
    assert rec["star:forward:y@0"].item() == 3.0  # what the message suggests works

    def passing(method):  # a decorator without functools.wraps
        def inner(*args, **kwargs):
            return method(*args, **kwargs)

        return inner

    class Decorated(torch.nn.Module):
        @passing
        def forward(self, x):
            return x

    with pytest.raises(
        bcrecord.NotPatchableError, match=r"\(its function is .*passing.<locals>.inner: a decorator's\?\)"
    ):
        expand(Decorated(), "")


def test_an_fx_name_after_a_call_of_a_function_an_expression_computes_is_refused_before_it_maps():
    # FX names such a call as the op it is when traced: here its 'relu_1', with the named call
    # after it its 'relu_2'. bcrecord gave that named call for 'relu_1', silently.
    acts = {"relu": torch.nn.functional.relu}

    class Picked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = torch.nn.functional.relu(self.lin(x) - 1)
            y = acts["relu"](y + 1)
            return torch.nn.functional.relu(y * 2 - 1)

    model = Picked().eval()
    with pytest.raises(bcrecord.TargetError) as caught:
        expand(model, "relu_1")
    assert str(caught.value) == (
        "'relu_1': Picked calls a function an expression computes (ACTS[name](x), getattr(F, name)(x), "
        "(f if c else g)(x)), which FX names as the op it is when traced ('relu' too, numbered with these) "
        "and which is no site, so FX's 'relu' names from there on are not fixed; name the site instead: "
        "':forward:torch.nn.functional.relu()@0', ':forward:torch.nn.functional.relu()@1'"
    )
    traced = [node.name for node in torch.fx.symbolic_trace(model).graph.nodes if "relu" in node.name]
    assert traced == ["relu", "relu_1", "relu_2"]
    (first,) = expand(model, "relu")  # before it: FX's own
    assert first.spec == bcrecord.Call("torch.nn.functional.relu", 0)
    x = torch.randn(2, 4)
    got = bcrecord.torch.create_feature_extractor(model, ["relu"])(x)["relu"]
    assert torch.equal(got, torch.relu(model.lin(x) - 1))


def test_an_fx_name_of_an_op_after_a_loop_maps_to_its_site():
    # As densenet's _DenseBlock: a loop over layers, then one torch.cat FX names 'cat'.
    from bcrecord.torch import create_feature_extractor

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x) * 2
            return torch.flatten(x, 1)

    features = create_feature_extractor(Blocks(), ["flatten"])(torch.ones(1, 2, 2))
    assert torch.equal(features["flatten"], torch.full((1, 4), 4.0))
    with pytest.raises(bcrecord.TargetError, match="'mul': Blocks runs 'mul' in a loop"):
        create_feature_extractor(Blocks(), ["mul"])


def _helper_scale(x):  # a Python helper FX traces into: its ops are numbered with its caller's
    return x * 3


def _helper_shift(x):
    return x + 7


def _helper_outer(x):  # FX traces two levels down: the add in _helper_shift is numbered too
    return _helper_shift(x) * 1


def test_fx_names_follow_the_module_methods_forward_calls_in_the_order_they_run():
    # As inception's InceptionE: forward returns torch.cat(self._forward(x)), whose two cats run first.
    from bcrecord.torch import create_feature_extractor

    class Branches(torch.nn.Module):
        def _forward(self, x):
            a = torch.cat([x, x])  # FX 'cat'
            b = torch.cat([x + 1, x + 1])  # FX 'cat_1'
            return [a, b]

        def forward(self, x):
            if x.dim() > 5:  # a branch with no cat in it leaves the numbering fixed
                x = x.squeeze(0)
            return torch.cat(self._forward(x))  # FX 'cat_2'

    features = create_feature_extractor(Branches(), ["cat", "cat_1", "cat_2"])(torch.zeros(1))
    assert [features[name].tolist() for name in ("cat", "cat_1")] == [[0.0, 0.0], [1.0, 1.0]]
    assert features["cat_2"].tolist() == [0.0, 0.0, 1.0, 1.0]
    (first,) = expand(Branches(), "cat")
    assert (first.method, first.spec.target, first.spec.index) == ("_forward", "torch.cat", (0,))

    class Shifted(torch.nn.Module):
        def forward(self, x):
            return _helper_shift(x) * 2  # the helper has an add, no mul

    assert create_feature_extractor(Shifted(), ["mul"])(torch.zeros(1))["mul"].item() == 14.0


class _Base(torch.nn.Module):
    def forward(self, x):
        return x + 1


class _Super(_Base):
    def forward(self, x):
        return super().forward(x) + 100


class _Helper(torch.nn.Module):
    def forward(self, x):
        return _helper_scale(x) * 5


class _Chained(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x).flatten(1) + torch.flatten(x, 1)


class _Comprehension(torch.nn.Module):
    def forward(self, x):
        return torch.stack([x * k for k in range(3)]) * 2


class _SubmoduleMethod(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 1, 1)

    def forward(self, x):  # _conv_forward is no module call: FX numbers its conv2d as ours
        a = self.conv._conv_forward(x, self.conv.weight, None)
        return torch.nn.functional.conv2d(a, self.conv.weight)


class _TwoLevels(torch.nn.Module):
    def forward(self, x):
        return _helper_outer(x) + 1


class _Partial(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.shift = functools.partial(_helper_shift)

    def forward(self, x):
        return self.shift(x) + 1


class _Twice(torch.nn.Module):
    def _step(self, x):
        return x + 2

    def forward(self, x):
        return self._step(self._step(x)) * 3


class _Sum(torch.nn.Module):
    def forward(self, x):
        s = sum([x, x * 2])  # FX: add (0 + x), add_1 (+ x * 2), made in C: no sites
        return s + 100  # FX: add_2


class _Reduce(torch.nn.Module):
    def forward(self, x):
        return functools.reduce(operator.add, [x, x]) + 1


def _helper_sum(xs):
    return sum(xs)


class _HelperSum(torch.nn.Module):
    def forward(self, x):
        return _helper_sum([x, x]) + 1


class _Property(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2))

    @property
    def scaled(self):
        return self.w * 2  # FX: mul, when forward reads the property

    def forward(self, x):
        return x * self.scaled  # FX: mul_1


class _SubmoduleProperty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Property()

    def forward(self, x):
        return x * self.inner.scaled  # the property's mul is numbered under this module


class _CachedProperty(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    @functools.cached_property
    def table(self):  # until it is computed, FX runs it: its mul on a parameter is a node
        return self.w * 2

    def forward(self, x):
        return x * self.table


class _AliasedMethod(torch.nn.Module):
    def _impl(self, x):
        return torch.sigmoid(x)

    def forward(self, x):
        f = self._impl  # FX traces into it where f is called
        return torch.sigmoid(f(x) * 2)


class _MethodByName(_AliasedMethod):
    def forward(self, x):
        return torch.sigmoid(getattr(self, "_impl")(x) * 2)  # noqa: B009  (as a name: FX follows it)


class _Lambda(torch.nn.Module):
    def forward(self, x):
        f = lambda t: torch.relu(t)  # noqa: E731
        return torch.relu(f(x) - 1)


class _InnerDef(torch.nn.Module):
    def forward(self, x):
        def g(t):
            return torch.relu(t)

        return torch.relu(g(x) - 1)


class _AliasedOp(torch.nn.Module):
    def forward(self, x):
        act = torch.nn.functional.relu
        x = act(x - 1)  # FX: 'relu'
        return torch.nn.functional.relu(x + 1)  # FX: 'relu_1'


class _ChosenOp(torch.nn.Module):
    def forward(self, x, average=False):
        pool = torch.nn.functional.max_pool2d if not average else torch.nn.functional.avg_pool2d
        return torch.nn.functional.max_pool2d(pool(x, 2), 1)


class _LoopAndNamesakes(torch.nn.Module):
    """Calls of loop variables beside loads named as ops that are no function it calls."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Identity()])
        self.dropout = 0.0  # a number named as the op

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        x = torch.nn.functional.dropout(x, p=self.dropout)
        return x.reshape(-1) + torch.relu(x).reshape(-1)


class _HeldOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fn = torch.nn.functional.relu  # as transformers' ACT2FN gives one

    def forward(self, x):
        act = self.act_fn
        return torch.relu(act(x) + 1)  # FX: 'relu' is act(x), 'relu_1' torch.relu


class _PropertyOfMe(torch.nn.Module):
    """_Property, with its instance not named self (only self's properties were looked at)."""

    def __init__(me):
        super().__init__()
        me.w = torch.nn.Parameter(torch.ones(2))

    @property
    def scaled(me):
        return me.w * 2

    def forward(me, x):
        return x * me.scaled


class _LoopedOps(torch.nn.Module):
    """Functions called through a loop variable or an unpacked local: FX names each call after
    the function it holds (the loop's 'tanh' was taken for torch.tanh's, 'tanh_1' in FX)."""

    def __init__(self):
        super().__init__()
        self.acts = [torch.relu, torch.tanh]
        self.pair = (torch.sigmoid, torch.tanh)

    def forward(self, x):
        for act in self.acts:
            x = act(x)
        f, g = self.pair
        return torch.tanh(g(f(x)) * 2)


class _PartialOp(torch.nn.Module):
    def forward(self, x):
        f = functools.partial(torch.add, other=1.0)
        return torch.add(f(x), 2)


def test_an_fx_refusal_names_each_site_once_where_a_helper_runs_several_times():
    # A helper forward runs twice, and once more through another: its site was listed each time.
    from bcrecord.torch import create_feature_extractor

    class Again(torch.nn.Module):
        def _step(self, x):
            return x + 1

        def _twice(self, x):
            return self._step(x) * 2

        def forward(self, x):
            y = self._step(x)
            return self._twice(self._step(y) + y)

    with pytest.raises(bcrecord.TargetError) as error:
        create_feature_extractor(Again(), ["add"])
    assert str(error.value).endswith("name the site instead: ':_step:+@0', ':forward:+@0'")


@pytest.mark.parametrize(
    "model, name, reason",
    [
        (_Sum, "add", "calls sum, whose 'add' ops on tensors \\(made in C: no site\\) FX numbers too"),
        (_Reduce, "add", "calls functools.reduce, whose 'add' ops"),
        (_HelperSum, "add", "calls _helper_sum, a Python function FX traces into, which has 'add' ops"),
        (_Property, "mul", "reads self.scaled, a property whose code FX traces into, which has 'mul' ops"),
        (_SubmoduleProperty, "mul", "reads self.inner.scaled, a property whose code FX traces into"),
        (_CachedProperty, "mul", "reads self.table, a property whose code FX traces into"),
        (_PropertyOfMe, "mul", "reads me.scaled, a property whose code FX traces into, which has 'mul' ops"),
        (_Super, "add", "calls a method through super"),
        (_Helper, "mul", "calls _helper_scale, a Python function FX traces into, which has 'mul' ops"),
        (_Chained, "flatten", r"calls \.flatten\(\) on a value that is not a name or attribute chain"),
        (_Comprehension, "mul_1", "runs 'mul' inside a comprehension"),
        (_Twice, "add", "runs self._step more than once"),
        (_SubmoduleMethod, "conv2d", "calls self.conv._conv_forward, a Python function FX traces into"),
        (_TwoLevels, "add", "calls _helper_outer, a Python function FX traces into, which has 'add' ops"),
        (_Partial, "add", "calls self.shift, a Python function FX traces into, which has 'add' ops"),
        (_AliasedMethod, "sigmoid", "refers to _impl, a method with 'sigmoid' ops, other than by calling it"),
        (_MethodByName, "sigmoid_1", "refers to _impl, a method with 'sigmoid' ops"),
        (_Lambda, "relu", "defines <lambda>, an inner function with 'relu' ops"),
        (_InnerDef, "relu_1", "defines g, an inner function with 'relu' ops"),
        (_PartialOp, "add", "calls functools.partial, whose 'add' ops on tensors"),
        (_AliasedOp, "relu", "calls act, a local it assigns 'relu' to"),
        (_ChosenOp, "max_pool2d", "calls pool, a local it assigns 'max_pool2d' to"),
        (_HeldOp, "relu_1", "calls act, a local it assigns 'relu' to"),
        (_LoopedOps, "tanh", "calls act, a local it assigns 'tanh' to"),
        (_LoopedOps, "tanh_1", "calls g, a local it assigns 'tanh' to"),
    ],
)
def test_fx_names_whose_numbering_the_code_does_not_fix_are_refused(model, name, reason):
    from bcrecord.torch import create_feature_extractor

    # (Other reasons may come first: _PartialOp's also calls its partial through a local.)
    with pytest.raises(bcrecord.TargetError, match=f"'{name}': {model.__name__} (.*; )?{reason}") as error:
        create_feature_extractor(model(), [name])
    assert "name the site instead: ':" in str(error.value)
    if model is _Twice:  # its mul is numbered either way: one site, outside _step
        assert create_feature_extractor(model(), ["mul"])(torch.zeros(1))["mul"].item() == 12.0


def test_fx_names_of_a_torch_function_held_by_the_module_or_of_a_method_of_an_instance_not_named_self():
    from bcrecord.torch import create_feature_extractor

    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = torch.sigmoid  # FX's node of self.gate(x) is 'sigmoid', torch.sigmoid's 'sigmoid_1'

        def forward(self, x):
            return torch.sigmoid(self.gate(x) * 2)

    class Me(torch.nn.Module):
        def _impl(me, x):
            return torch.sigmoid(x)

        def forward(me, x):  # FX follows me._impl as it follows self._impl
            return torch.sigmoid(me._impl(x) * 2)

    class Held(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # FX's node of self.gate(x) is the function's, 'sigmoid' (the partial's name was taken,
            # 'gate': torch.sigmoid's node 'sigmoid_1' was given as 'sigmoid')
            self.gate = functools.partial(torch.sigmoid, out=None)

        def forward(self, x):
            return torch.sigmoid(self.gate(x) * 2)

    class Aliased(torch.nn.Module):
        def __init__(self, partial):
            super().__init__()
            self.sigmoid = torch.nn.Sigmoid()
            # FX names a call of the module by its path, 'sigmoid', whatever it is called through
            # (only a call as self.sigmoid was counted: torch.sigmoid's 'sigmoid_1' was given).
            self.gate = functools.partial(self.sigmoid) if partial else self.sigmoid

        def forward(self, x):
            return torch.sigmoid(self.gate(x) * 2)

    x = torch.tensor([[-1.0, 0.5, 2.0]])
    for model in (Gate(), Me(), Held(), Aliased(False), Aliased(True)):  # FX's values (torchvision's too)
        features = create_feature_extractor(model, ["sigmoid", "sigmoid_1"])(x)
        assert torch.equal(features["sigmoid"], torch.sigmoid(x)), type(model).__name__
        assert torch.equal(features["sigmoid_1"], torch.sigmoid(torch.sigmoid(x) * 2))


def test_fx_names_that_the_code_fixes_map_despite_branches_and_other_calls():
    from bcrecord.torch import create_feature_extractor

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = torch.nn.ReLU()

        def forward(self, x):
            return self.relu(x)

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()
            self.lin = torch.nn.Linear(2, 2)
            self.scale = True

        def forward(self, x):
            y = self.inner.relu(x - 1)  # FX names it 'inner.relu': no 'relu' of Mixed
            if self.scale:  # both muls in the same branch: they run together
                y = y * 2
                y = y * 3
            a = torch.flatten(y, 0)  # FX 'flatten', before the chained call: fixed
            b = self.lin(y).flatten(0)  # FX 'flatten_1': no site
            c = torch.flatten(y + 1, 0)  # FX 'flatten_2': after one that is no site, refused
            return torch.relu(a + b + c)

    x = torch.tensor([[2.0, 0.5]])
    features = create_feature_extractor(Mixed(), ["relu", "mul", "mul_1", "flatten"])(x)
    assert features["mul"].tolist() == [[2.0, 0.0]] and features["mul_1"].tolist() == [[6.0, 0.0]]
    assert features["flatten"].tolist() == [6.0, 0.0]
    assert features["relu"].shape == (2,) and (features["relu"] >= 0).all()  # torch.relu, not inner's
    for name in ("flatten_1", "flatten_2"):
        message = rf"'{name}': Mixed calls \.flatten\(\) on a value .* from there on are not fixed"
        with pytest.raises(bcrecord.TargetError, match=message):
            create_feature_extractor(Mixed(), [name])


_WRAPPED_HELPER = """
import torch


def scaled(x):
    return torch.relu(x) * 2


torch.fx.wrap("scaled")  # FX makes one node of its calls, and numbers nothing inside


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        x = scaled(self.lin(x) - 1)
        return torch.relu(x - 3) * 4
"""


def test_fx_names_map_past_a_function_fx_wrap_made_one_node():
    # Its relu and mul were taken for ops FX numbers with the caller's: 'relu' and 'mul' refused
    # (torchvision's swin_v2 wraps its _get_relative_position_bias).
    import types

    from bcrecord.torch import create_feature_extractor

    module = types.ModuleType("bcrecord_fx_wrapped")
    exec(compile(_WRAPPED_HELPER, "<fx_wrapped>", "exec"), module.__dict__)  # (wrap needs module level)
    net, x = module.Net(), torch.tensor([[2.0, 0.5]])
    traced = [node.name for node in torch.fx.symbolic_trace(net).graph.nodes]
    assert traced == ["x", "lin", "sub", "scaled", "sub_1", "relu", "mul", "output"]
    features = create_feature_extractor(net, ["scaled", "relu", "mul"])(x)
    inner = module.scaled(net.lin(x) - 1)
    assert torch.equal(features["scaled"], inner)
    assert torch.equal(features["relu"], torch.relu(inner - 3))
    assert torch.equal(features["mul"], torch.relu(inner - 3) * 4)
    # Called through its module (helpers.scaled(x)), where FX swaps it all the same.
    user = types.ModuleType("bcrecord_fx_wrapped_user")
    user.helpers = module
    exec(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self, lin):\n"
        "        super().__init__()\n"
        "        self.lin = lin\n"
        "    def forward(self, x):\n"
        "        x = helpers.scaled(self.lin(x) - 1)\n"
        "        return torch.relu(x - 3) * 4\n",
        user.__dict__,
    )
    through = create_feature_extractor(user.Net(net.lin), ["relu", "mul"])(x)
    assert torch.equal(through["relu"], features["relu"]) and torch.equal(through["mul"], features["mul"])


def test_an_fx_name_with_no_site_says_what_fx_names_cannot_be_mapped():
    class Indexing(torch.nn.Module):
        def forward(self, x):
            return x[0] + x.size(0)

    with pytest.raises(bcrecord.TargetError) as error:
        expand(Indexing(), "getitem")
    assert str(error.value).startswith("the model has no submodule 'getitem'; nor is 'getitem' an FX name")
    assert "pick a target from list_targets" in str(error.value)
    # A Sequential index past its end is no FX name: only the "did you mean".
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU()))
    with pytest.raises(bcrecord.TargetError) as error:
        expand(model, "0.5")
    assert str(error.value) == "the model has no submodule '0.5'; did you mean '0.1', '0.0'?"

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.ones(2))

        def _embed(self, x):
            return x + self.token

        def forward(self, x):
            return self._embed(x)

    holder = torch.nn.Sequential(Embed())
    # FX's get_attr node of a parameter: the module's path, then the tensor's with "_"
    message = "'0.0_token' is FX's node for the tensor '0.token'.*reads it: '0:_embed:self.token@0'"
    with pytest.raises(bcrecord.TargetError, match=message):
        expand(holder, "0.0_token")
    with pytest.raises(bcrecord.TargetError, match="has no submodule 'nope.add'$"):
        expand(Indexing(), "nope.add")  # no module there at all: only that is said


def test_an_fx_name_numbered_with_a_digit_that_is_no_decimal_is_no_fx_name():
    class Adding(torch.nn.Module):
        def forward(self, x):
            return x + 1

    # '²' is a digit to str.isdigit, no number to int: a missing name, not int's ValueError.
    for name in ("add_\u00b2", "\u00b2"):
        with pytest.raises(bcrecord.TargetError, match=f"^the model has no submodule {name!r}"):
            expand(Adding(), name)
    assert [t.spec for t in expand(Adding(), "add")] == [bcrecord.Expr("+", 0)]


def test_names_fx_never_makes_a_leading_dot_or_a_number_from_zero_are_no_fx_names():
    # '.add' was taken for the root's 'add', 'add_01' for 'add_1' and 'add_0' for 'add'.
    class Adding(torch.nn.Module):
        def forward(self, x):
            return (x + 1) + 2

    model = torch.nn.Sequential()
    model.add_module("inner", Adding())
    for name in (".inner", ".inner.add", "inner.add_01", "inner.add_0", "inner.add_00"):
        with pytest.raises(bcrecord.TargetError) as caught:
            expand(model, name)
        said = str(caught.value).lower()
        assert said.startswith(f"the model has no submodule {name!r}")
        assert ("nor is" in said) == ("_0" in name)  # (an FX name's number, not a dot, is said)
    assert [t.spec for t in expand(model, "inner.add_1")] == [bcrecord.Expr("+", 1)]


def test_fx_names_map_beside_calls_of_loop_variables():
    model = _LoopAndNamesakes()
    assert expand(model, "dropout")[0].spec == bcrecord.Call("torch.nn.functional.dropout", 0)
    assert expand(model, "reshape")[0].spec == bcrecord.Call("x.reshape", 0)
    with pytest.raises(bcrecord.TargetError, match=r"calls \.reshape\(\) on a value that is not a name"):
        expand(model, "reshape_1")  # torch.relu(x).reshape: FX's 'reshape_1', no site


def test_an_fx_name_of_a_call_on_a_call_s_result_says_so():
    class Attention(torch.nn.Module):  # timm's: qkv = self.qkv(x).reshape(...)
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(4, 12)

        def forward(self, x):
            return self.qkv(x).reshape(2, 3, 4).sum(1)

    message = r"'reshape': Attention calls \.reshape\(\) only on values"
    with pytest.raises(bcrecord.TargetError, match=message):
        expand(Attention(), "reshape")


def test_an_fx_name_past_a_module_s_sites_says_fx_numbers_each_run_of_a_module_run_twice():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) + x

    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(self.block(x))

    with pytest.raises(bcrecord.TargetError, match=r"no number 1; FX numbers the ops of each run of 'block'"):
        expand(Shared(), "block.add_1")
    with pytest.raises(bcrecord.TargetError, match=r"there is no number 1$"):  # a module run once
        expand(torch.nn.Sequential(Block()), "0.add_1")


def test_fx_names_count_torch_nn_modules_torchvision_strips_to_the_name():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_1 = torch.nn.Linear(2, 2)
            self.w = torch.nn.Parameter(torch.ones(2, 2))

        def forward(self, x):
            x = self.linear_1(x)  # torchvision: 'linear' (it strips the module name's number)
            return torch.nn.functional.linear(x, self.w)  # torchvision: 'linear_1'

    (first,) = expand(Net(), "linear")
    assert (first.path, first.spec) == ("", bcrecord.Call("self.linear_1", 0))


def test_fx_names_resolve_a_callee_s_root_as_the_function_sees_it():
    # A global named as forward's argument (a notebook's x): not what forward calls split on.
    namespace = {"torch": torch, "x": torch.ones(3)}
    source = (
        "class Split(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.cat(x.split(1, 1), 1)\n"
    )
    exec(source, namespace)
    (target,) = expand(namespace["Split"](), "split")
    assert target.spec == bcrecord.Call("x.split", 0)

    def make(act):
        class Closure(torch.nn.Module):
            def forward(self, x):
                return torch.relu(act(x) + 1)  # act is torch.relu: FX's 'relu', torch.relu's 'relu_1'

        return Closure()

    (target,) = expand(make(torch.relu), "relu_1")
    assert target.spec == bcrecord.Call("torch.relu", 0)


def test_an_fx_name_that_maps_is_not_compared_with_every_module_path(monkeypatch):
    from bcrecord.torch import targets

    compared = []
    monkeypatch.setattr(targets, "did_you_mean", lambda word, names, **_: compared.append(word) or "")
    model = SmallNet()
    mapped = expand(model, "blocks.0.add")  # an op, not a module: found without a "did you mean"
    assert [(t.path, t.spec) for t in mapped] == [("blocks.0", bcrecord.Expr("+", 0))] and compared == []
    with pytest.raises(bcrecord.TargetError):
        module_at(model, "blocks.0.conv9")
    assert compared == ["blocks.0.conv9"]


def test_a_missing_path_is_compared_with_the_paths_under_its_deepest_existing_ancestor():
    first = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    model = torch.nn.ModuleDict({"a": first, "b": torch.nn.Sequential(torch.nn.ReLU())})
    # 'b.0' is closer to 'a.b.0' than 'a.0' is, but 'a' exists: the typo is below it
    with pytest.raises(bcrecord.TargetError, match=r"no submodule 'a\.b\.0'; did you mean 'a\.0'\?$"):
        module_at(model, "a.b.0")
    with pytest.raises(bcrecord.TargetError, match=r"no submodule 'c\.0'; did you mean 'b\.0', 'a\.0'\?$"):
        module_at(model, "c.0")  # no ancestor: every path


def test_a_submodule_set_under_a_dotted_name_is_refused_saying_so():
    # It said "no submodule 'x.y'; did you mean 'x.y'?": named_modules lists it, no path reaches it.
    model = torch.nn.Sequential(torch.nn.ReLU())
    setattr(model, "x.y", torch.nn.ReLU())  # (add_module and ModuleDict refuse the dot)
    with pytest.raises(
        bcrecord.TargetError, match=r"listed as 'x\.y' has a '\.' in its name \(set with setattr"
    ):
        expand(model, "x.y")
    with pytest.raises(
        bcrecord.TargetError, match=r"^the model has no submodule 'x\.z'; did you mean 'x\.y'\?$"
    ):
        module_at(model, "x.z")


def _shuffle(x):  # as shufflenet's channel_shuffle: a helper whose ops FX numbers as its caller's
    return x.view(2, -1).transpose(0, 1)


def test_an_fx_name_made_only_inside_a_helper_names_the_helper():
    class Shuffled(torch.nn.Module):
        def forward(self, x):
            return _shuffle(x) * 2

    message = (
        r"^'view': Shuffled calls _shuffle, a Python function FX traces into, which has 'view' ops "
        r".*, and has no 'view' site of its own: record inside a Python function it calls"
    )
    with pytest.raises(bcrecord.TargetError, match=message):
        expand(Shuffled(), "view")


def test_an_fx_name_maps_where_sum_or_a_property_makes_no_op_of_that_name():
    from bcrecord.torch import create_feature_extractor

    # sum's adds shift only 'add' names; the property's mul only 'mul' names
    assert create_feature_extractor(_Sum(), ["mul"])(torch.ones(1))["mul"].item() == 2.0

    class Doubled(_Property):
        def forward(self, x):
            return (x + self.scaled).sum()  # one add: the property makes a mul, not an add

    assert create_feature_extractor(Doubled(), ["add"])(torch.ones(2))["add"].tolist() == [3.0, 3.0]

    class Sizes(torch.nn.Module):
        def forward(self, x):  # map() given int, which makes no 'mul' or 'flatten' node
            h, w = map(int, x.shape[-2:])
            return torch.flatten(x * 2, 1) * (h * w)

    features = create_feature_extractor(Sizes(), ["mul", "flatten"])(torch.ones(1, 2, 2))
    assert [features[name].tolist() for name in ("mul", "flatten")] == [[[[2.0, 2.0]] * 2], [[2.0] * 4]]


def test_an_fx_tensor_node_suggests_a_method_forward_runs_or_says_there_is_none():
    class Attention(torch.nn.Module):  # as swin's: an __init__-time method reads the table first
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.ones(3))
            self.define_table()

        def define_table(self):
            self.index = self.table.shape[0]

        def bias(self):
            return self.table * 2

        def forward(self, x):
            return x + self.bias()

    with pytest.raises(bcrecord.TargetError, match="reads it: '0:bias:self.table@0'$"):
        expand(torch.nn.Sequential(Attention()), "0.0_table")
    message = (
        r"'w' is FX's node for the tensor 'w', not an output; no method its module's forward runs "
        r"reads self\.w \(a property or a helper may\), so no target reads it"
    )
    with pytest.raises(bcrecord.TargetError, match=message):
        expand(_Property(), "w")


def test_an_argument_of_forward_is_refused_as_the_input_it_is_and_shifts_ops_of_its_name():
    message = r"'x' is an argument of _Sum\.forward \(FX's placeholder node: the input as given\)"
    with pytest.raises(bcrecord.TargetError, match=message):
        expand(_Sum(), "x")

    class Padded(torch.nn.Module):
        def forward(self, x, pad):  # FX: the placeholder is 'pad', F.pad's node 'pad_1'
            return torch.nn.functional.pad(x, pad) * 2

    with pytest.raises(bcrecord.TargetError, match="'pad' is an argument of Padded.forward"):
        expand(Padded(), "pad")
    (target,) = expand(Padded(), "pad_1")
    assert (target.spec.target, target.spec.index) == ("torch.nn.functional.pad", (0,))


def test_a_module_whose_forward_is_a_generator_function_has_no_path_output_to_record():
    # Its path recorded the generator's own return when used up (None), not the generator.
    class Steps(torch.nn.Module):
        def forward(self, x):
            for i in range(3):
                step = x * i
                yield step

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.steps, self.lin = Steps(), torch.nn.Linear(2, 2)

        def forward(self, x):
            return torch.stack(list(self.steps(self.lin(x))))

    model = Net()
    with pytest.raises(bcrecord.TargetError) as caught:
        expand(model, "steps")
    assert str(caught.value) == (
        "Steps at 'steps': forward is a generator function, whose output is the generator the caller "
        "iterates, which a module path does not record: record what it yields where it makes it "
        "('steps:forward:<local>'), or where the caller takes it"
    )
    assert [t.path for t in expand(model, "*")] == ["lin"]  # a glob skips it, as list_targets does
    assert "steps" not in bcrecord.torch.list_targets(model)
    x = torch.ones(1, 2)
    with bcrecord.torch.record(model, ["steps:forward:step"]) as rec:
        model(x)
    expected = [(model.lin(x) * i).tolist() for i in range(3)]
    assert [v.tolist() for v in rec.all("steps:forward:step@0")] == expected


def test_an_fx_tensor_node_read_by_a_method_whose_instance_is_not_self_suggests_that_read():
    # It looked for 'self.scale' alone: "no method its module's forward runs reads self.scale".
    class Scaled(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.scale = torch.nn.Parameter(torch.ones(2))

        def forward(s, x):
            return x * s.scale

    with pytest.raises(bcrecord.TargetError, match="reads it: ':forward:s.scale@0'$"):
        expand(Scaled(), "scale")
    assert [t.text for t in expand(Scaled(), ":forward:s.scale@0")] == [":forward:s.scale@0"]


def test_an_fx_tensor_node_read_by_a_parent_module_suggests_the_parent_s_read():
    class Parent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.child = torch.nn.Module()
            self.child.scale = torch.nn.Parameter(torch.ones(2))

        def forward(self, x):
            return x * self.child.scale

    with pytest.raises(bcrecord.TargetError, match="reads it: ':forward:self.child.scale@0'$"):
        expand(Parent(), "child_scale")


def test_a_gradient_suffix_given_twice_is_named_as_such():
    # 'h@0.grad.grad' was "bad index in 'h@0.grad'"; 'h.grad.grad' an entry attribute chain's error.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    for target in ("0:forward:input@0.grad.grad", "0:forward:input.grad .grad", "0:forward:return.grad.grad"):
        with pytest.raises(bcrecord.SpecError) as caught:
            expand(model, target)
        said = f"bad target {target!r}: '.grad' is given twice ('<target>.grad' is its gradient)"
        assert str(caught.value) == said
    (target,) = expand(model, "0:forward:input@0.grad")
    assert target.grad and target.spec == Local("input", (0,))


def test_an_entry_read_of_a_parametrized_tensor_is_refused_for_its_load_site():
    from torch.nn.utils.parametrizations import spectral_norm, weight_norm

    from bcrecord.torch import record

    torch.manual_seed(0)
    model = torch.nn.Sequential(spectral_norm(torch.nn.Linear(4, 4)), weight_norm(torch.nn.Linear(4, 4)))
    twin = copy.deepcopy(model)
    x = torch.randn(2, 4)
    for target in ("0:forward:self.weight", "1:forward:self.weight.grad"):
        suffix = r"\.grad'" if target.endswith(".grad") else "'"
        message = r"'self\.weight' is parametrized .*'self\.weight@0" + suffix
        with pytest.raises(bcrecord.TargetError, match=message):
            expand(model, target)
    targets = [
        "0:forward:self.weight@0.grad",
        "0:forward:self.bias",
        "0:forward:return",
        "1:forward:self.weight@0",
    ]
    with record(model, targets) as rec:
        model(x).sum().backward()
    twin(x).sum().backward()
    # The power iteration ran once, as unrecorded: the same buffers.
    state, twin_state = model.state_dict(), twin.state_dict()
    assert all(torch.equal(state[k], twin_state[k]) for k in state)
    # The load site is the tensor the forward used, and its gradient is that tensor's.
    used, bias = rec["0:forward:self.weight@0"], rec["0:forward:self.bias"]
    assert torch.allclose(torch.nn.functional.linear(x, used, bias), rec["0:forward:return"])
    expected = (torch.ones(2, 4) @ rec["1:forward:self.weight@0"]).T @ x
    assert torch.allclose(rec["0:forward:self.weight@0.grad"], expected)


def test_a_path_into_a_torchscript_submodule_is_refused_saying_why():
    # A scripted module's _modules has no .get: a path or glob below it crashed with an
    # AttributeError from the parametrization check instead of naming the problem.
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), scripted)
    assert isinstance(module_at(net, "1.0"), torch.jit.ScriptModule)
    with pytest.raises(bcrecord.NotPatchableError, match="at '1.0' is a TorchScript module"):
        expand(net, "1.0:forward:return")
    with pytest.raises(bcrecord.TargetError, match="'1.\\*' matches only .* or TorchScript modules"):
        expand(net, "1.*")
    with pytest.raises(bcrecord.TargetError, match="'\\*.\\*' matches only .* or TorchScript modules"):
        expand(net, "*.*")


class _KeyedHeads(torch.nn.Module):
    """A ModuleDict whose keys torch allows but target strings use: ':' and 'grad'."""

    def __init__(self):
        super().__init__()
        self.heads = torch.nn.ModuleDict({"grad": torch.nn.Linear(2, 2), "task:cls": torch.nn.Tanh()})

    def forward(self, x):
        return self.heads["task:cls"](self.heads["grad"](x))


def test_a_glob_skips_a_module_whose_forward_only_raises_as_it_has_no_output():
    # JetMoe's JetMoeMoA.forward only raises (the model calls its map and reduce): a glob
    # matching it ('**') was refused ("OnlyRaises.forward has no return instruction"), not skipping it.
    net, x = CallsMap(), torch.ones(1, 2)
    assert [t.path for t in expand(net, "**")] == ["moa.lin"]
    assert [t.path for t in expand(net, "**:forward:return")] == ["moa.lin"]
    with bcrecord.torch.record(net, ["**", "moa.*"]) as rec:
        out = net(x)
    assert rec.keys() == ["moa.lin:forward:return"] and torch.equal(rec["moa.lin:forward:return"], out)
    with pytest.raises(bcrecord.TargetError, match="OnlyRaises.forward has no return instruction"):
        with bcrecord.torch.record(net, ["moa"]):  # named: refused, saying why
            pass
    with pytest.raises(bcrecord.TargetError, match=r"'m\*' matches only .*, forwards with no return,"):
        expand(net, "m*")


def test_a_submodule_named_with_a_colon_or_grad_is_a_path_as_list_targets_and_globs_name_it():
    # list_targets listed 'heads.task:cls' and 'heads.grad', which were refused as bad
    # targets (or, 'heads.grad', as a '.grad' suffix), while 'heads.*' recorded them.
    net = _KeyedHeads()
    listed = bcrecord.torch.list_targets(net)
    assert "heads.task:cls" in listed and "heads.grad" in listed
    (t,) = expand(net, "heads.task:cls")
    assert (t.text, t.path, t.output, t.grad) == ("heads.task:cls", "heads.task:cls", True, False)
    (t,) = expand(net, "heads.grad")
    assert (t.text, t.path, t.output, t.grad) == ("heads.grad", "heads.grad", True, False)
    (t,) = expand(net, "heads.task:cls:forward:return.grad")
    assert (t.path, t.method, t.spec, t.grad) == ("heads.task:cls", "forward", Return(), True)
    x = torch.randn(3, 2)
    with bcrecord.torch.record(net, ["heads.grad", "heads.task:cls:forward:return.grad"]) as rec:
        y = net(x)
        (y * y).sum().backward()
    assert torch.equal(rec["heads.grad:forward:return"], net.heads["grad"](x))
    assert torch.allclose(rec["heads.task:cls:forward:return.grad"], 2 * y)
    # Still no gradient of a bare path: the refusal names the target to write instead.
    with pytest.raises(bcrecord.SpecError, match="'heads.task:cls:forward:return.grad' for the gradient"):
        expand(net, "heads.task:cls.grad")


def test_a_glob_over_submodule_names_with_a_colon_matches_them_as_list_targets_lists_them():
    # 'heads.task:*' was refused as a bad target (one ':', so no 'path:method:spec')
    # while 'heads.*' took the same modules; and 'heads.task:cls.grad' got the generic
    # "expected 'module.path:method:target'" where 'heads.b.grad' was told to add a method.
    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            names = ["task:cls", "task:box", "aux"]
            self.heads = torch.nn.ModuleDict({name: torch.nn.Linear(2, 2) for name in names})

        def forward(self, x):
            return sum(head(x) for head in self.heads.values())

    net = Heads()
    assert [t.text for t in expand(net, "heads.task:*")] == ["heads.task:cls", "heads.task:box"]
    assert [t.path for t in expand(net, "heads.task:*:forward:return.grad")] == [
        "heads.task:cls",
        "heads.task:box",
    ]
    x = torch.randn(3, 2, requires_grad=True)
    with bcrecord.torch.record(net, ["heads.task:*", "heads.task:*:forward:F.linear()@0.grad"]) as rec:
        y = net(x)
        (y * y).sum().backward()
    assert rec.keys_of("heads.task:*") == ["heads.task:cls:forward:return", "heads.task:box:forward:return"]
    assert torch.equal(rec["heads.task:box:forward:return"], net.heads["task:box"](x).detach())
    assert torch.allclose(rec["heads.task:cls:forward:F.linear()@0.grad"], 2 * y.detach())
    listed = str(bcrecord.torch.list_targets(net)).splitlines()
    # The table's header is the module's path, as the targets name it, not 'heads.task'.
    assert "heads.task:cls" in listed and "heads.task" not in listed
    assert "    heads.task:cls:forward:return" in listed and "    heads.task:cls" not in listed
    for bad, error, message in [
        ("heads.task:cls.grad", bcrecord.SpecError, "'heads.task:cls:forward:return.grad' for the gradient"),
        ("heads.aux.grad", bcrecord.SpecError, "'heads.aux:forward:return.grad' for the gradient"),
        ("heads.task:*.grad", bcrecord.SpecError, "'heads.task:\\*:forward:return.grad'"),
        (
            "heads.tusk:cls",
            bcrecord.TargetError,
            "no submodule 'heads.tusk:cls'; did you mean 'heads.task:cls'",
        ),
        ("heads.tusk:*", bcrecord.TargetError, "no submodule matches 'heads.tusk:\\*'"),
    ]:
        with pytest.raises(error, match=message):
            expand(net, bad)


def test_a_submodule_named_with_two_colons_is_a_path_as_list_targets_lists_it():
    # A submodule named 'task:cls:v2' (two ':', as in 'path:method:spec'): list_targets listed
    # 'heads.task:cls:v2' and '**' expanded to it, but the path itself was read as path
    # 'heads.task', method 'cls', spec 'v2': "the model has no submodule 'heads.task'", so
    # record(model, list_targets(model)) was refused, and a Target's text did not expand back.
    net = torch.nn.Sequential()
    net.add_module("heads", torch.nn.Sequential())
    net.heads.add_module("task:cls:v2", torch.nn.Tanh())
    listed = bcrecord.torch.list_targets(net)
    assert "heads.task:cls:v2" in listed and "heads.task:cls:v2:forward:return" in listed
    (t,) = expand(net, "heads.task:cls:v2")
    assert (t.text, t.path, t.method, t.output) == ("heads.task:cls:v2", "heads.task:cls:v2", "forward", True)
    assert [t.text for t in expand(net, "**")] == ["heads", "heads.task:cls:v2"]
    x = torch.randn(3)
    with bcrecord.torch.record(net, listed) as rec:
        y = net(x)
    assert torch.equal(rec["heads.task:cls:v2:forward:return"], y)
    with pytest.raises(bcrecord.TargetError, match="no submodule 'heads.task'"):
        expand(net, "heads.task:cls:v3")  # (not a path: a target, whose path is not there)


def test_a_submodule_named_with_two_colons_beside_one_named_its_first_part_is_a_path():
    # With both 'task' and 'task:cls:v2', list_targets listed 'task:cls:v2', read as path 'task',
    # method 'cls': "Tanh at 'task' has no method 'cls'", and record(net, list_targets(net)) refused.
    net = torch.nn.ModuleDict({"task": torch.nn.Tanh(), "task:cls:v2": torch.nn.ReLU()})
    (t,) = expand(net, "task:cls:v2")
    assert (t.text, t.path, t.method, t.output) == ("task:cls:v2", "task:cls:v2", "forward", True)
    assert [t.path for t in expand(net, "task:forward:return")] == ["task"]  # a method of 'task': its target
    x = torch.randn(3)
    with bcrecord.torch.record(net, bcrecord.torch.list_targets(net)) as rec:
        y = net["task:cls:v2"](x)
    assert torch.equal(rec["task:cls:v2:forward:return"], y)
    with pytest.raises(bcrecord.NotPatchableError, match="Tanh at 'task' has no method 'cls'"):
        expand(net, "task:cls:v3")


def test_a_scripted_model_is_refused_saying_why_at_any_path():
    # torch refuses get_submodule on a ScriptModule: every path but the root crashed with
    # "get_submodule is not supported on ScriptModules" (record(), globs, extractors).
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    assert isinstance(module_at(scripted, "1"), torch.jit.ScriptModule)
    with pytest.raises(bcrecord.NotPatchableError, match="at '0' is a TorchScript module"):
        expand(scripted, "0")
    with pytest.raises(bcrecord.NotPatchableError, match="at '0' is a TorchScript module"):
        bcrecord.torch.create_feature_extractor(scripted, ["0"])
    with pytest.raises(bcrecord.TargetError, match="'\\*' matches only .* or TorchScript modules"):
        expand(scripted, "*")
    with pytest.raises(bcrecord.TargetError, match="the model has no submodule '2'"):
        module_at(scripted, "2")


def test_an_entry_read_of_a_parametrized_tensor_is_refused_spelt_private():
    from torch.nn.utils.parametrizations import spectral_norm

    from bcrecord.torch import record

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.__lin = spectral_norm(torch.nn.Linear(4, 4))

        def forward(self, x):
            return self.__lin(x)

    torch.manual_seed(0)
    model = Net()
    # 'self.__lin' is the module's '_Net__lin', as the class's code spells it: both are refused.
    for chain in ("self.__lin", "self._Net__lin"):
        with pytest.raises(bcrecord.TargetError, match=rf"'{chain}\.weight' is parametrized .*'{chain}"):
            expand(model, f":forward:{chain}.weight")
    x = torch.randn(2, 4)
    with record(model, ["_Net__lin:forward:self.weight@0", "_Net__lin"]) as rec:
        out = model(x)
    lin = model._Net__lin
    assert torch.allclose(
        torch.nn.functional.linear(x, rec["_Net__lin:forward:self.weight@0"], lin.bias), out
    )


def test_a_method_named_as_the_source_writes_it_is_the_one_the_compiler_stored_nfkc_normalised():
    # 'def \ufb01wd' (a ligature) defines 'fiwd': the target names the method as the source has it.
    namespace: dict = {"torch": torch}
    source = (
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n        return self.\ufb01wd(x)\n"
        "    def \ufb01wd(self, x):\n        h = x + 1\n        return h\n"
    )
    exec(source, namespace)
    net = namespace["Net"]()
    (target,) = expand(net, ":\ufb01wd:h")
    assert (target.path, target.method, target.spec) == ("", "fiwd", bcrecord.parse("h"))
    with bcrecord.torch.record(net, [":\ufb01wd:h"]) as rec:
        net(torch.ones(1))
    assert rec.keys_of(":\ufb01wd:h") == [":fiwd:h@0"] and rec[":fiwd:h@0"].tolist() == [2.0]


def _compiled_in_the_middle() -> Tuple[torch.nn.Sequential, torch.Tensor, torch.Tensor]:
    """A Sequential whose block ``'1'`` (Linear, ReLU) is compiled in its place, an input, and
    what the block's Linear gives for it (eager)."""
    import torch._dynamo

    torch.manual_seed(0)
    torch._dynamo.reset()
    middle_block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), middle_block, torch.nn.Linear(4, 2)).eval()
    x = torch.randn(2, 4)
    with torch.no_grad():
        inner = model[1][0](model[0](x))
    model[1] = torch.compile(model[1], backend="eager")
    return model, x, inner


def test_a_submodule_compiled_in_place_of_itself_records_at_its_path_and_under_a_glob():
    # `model.layer1 = torch.compile(model.layer1)`: its path, and any glob matching it ('*',
    # 'layer*'), raised NotPatchableError "OptimizedModule at '1' runs a forward set on the
    # instance", as the root's compiled wrapper never did.
    from bcrecord.torch import create_feature_extractor, record

    model, x, inner = _compiled_in_the_middle()
    middle = torch.relu(inner)
    assert [t.path for t in expand(model, "*")] == ["0", "1", "2"]
    with torch.no_grad(), record(model, ["*", "1:forward:input", "1.0"]) as rec:
        out = model(x)
    assert torch.allclose(rec["1:forward:return"], middle, atol=1e-6)
    assert torch.allclose(rec["1.0:forward:return"], inner, atol=1e-6)
    assert torch.allclose(rec["2:forward:return"], out)
    # (the loop's store of each module's output: the last, its ReLU's, is the block's)
    first, last = rec.all("1:forward:input@0")
    assert torch.allclose(first, inner, atol=1e-6) and torch.allclose(last, middle, atol=1e-6)
    extractor = create_feature_extractor(model, ["1"])
    assert torch.allclose(extractor(x)["1"], middle, atol=1e-6)
    extractor.close()


def test_globs_and_list_targets_see_through_a_submodule_compiled_in_place():
    # '1.*' matched torch.compile's wrapper attribute '1._orig_mod' (the whole block again,
    # under the wrapper's path), not the block's children '1.0' and '1.1'; '*.0' and
    # '1.*.lin'-style globs under it matched nothing; ['*', '*.*'] was refused: "'1._orig_mod'
    # and '1' are the same Sequential"; list_targets listed '1._orig_mod...' paths.
    from bcrecord.torch import list_targets, record

    model, x, inner = _compiled_in_the_middle()
    assert [t.path for t in expand(model, "1.*")] == ["1.0", "1.1"]
    assert [t.path for t in expand(model, "*.*")] == ["1.0", "1.1"]
    assert [t.path for t in expand(model, "*.0")] == ["1.0"]
    assert [path for path, _ in named_modules(model)] == ["", "0", "1", "1.0", "1.1", "2"]
    assert named_modules(model)[2][1] is model[1]._orig_mod
    paths = [target for target in list_targets(model) if ":" not in target]
    assert paths == ["", "0", "1", "1.0", "1.1", "2"]
    assert "1:forward:return" in list_targets(model)
    with torch.no_grad(), record(model, ["*", "*.*"]) as rec:
        model(x)
    assert sorted(rec.keys()) == sorted(f"{path}:forward:return" for path in ("0", "1", "1.0", "1.1", "2"))
    assert torch.allclose(rec["1.0:forward:return"], inner, atol=1e-6)
    assert torch.allclose(rec["1.1:forward:return"], inner.relu(), atol=1e-6)
    # The wrapper's own paths, as named_modules() names them, still match and record.
    assert [t.path for t in expand(model, "1._orig_mod.*")] == ["1._orig_mod.0", "1._orig_mod.1"]
    with torch.no_grad(), record(model, ["1._orig_mod.0"]) as rec:
        model(x)
    assert torch.allclose(rec["1._orig_mod.0:forward:return"], inner, atol=1e-6)
    # Under a compiled root too; the root wrapper's own paths still match as they did.
    compiled = torch.compile(model, backend="eager")
    assert [t.path for t in expand(compiled, "*.*")] == ["1.0", "1.1"]
    assert [t.path for t in expand(compiled, "_orig_mod.1.*")] == ["_orig_mod.1.0", "_orig_mod.1.1"]


def test_a_module_shared_at_two_paths_with_one_compiled_is_listed_once_as_uncompiled():
    # model.b = torch.compile(model.a): '*' matched 'b' as well as 'a' and list_targets listed
    # 'b...' targets, so record(model, ['*']) and record(model, list_targets(model)) were
    # refused ("'b' and 'a' are the same Sequential object"), where the model uncompiled
    # (named_modules() lists a shared module once) records both.
    import torch._dynamo

    from bcrecord.torch import list_targets, record

    torch._dynamo.reset()
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    model = torch.nn.Sequential(block, torch.compile(block, backend="eager"))
    x = torch.randn(2, 4)
    with torch.no_grad():
        first = block[0](x)
        second = block[0](first.relu())
    assert [path for path, _ in named_modules(model)] == ["", "0", "0.0", "0.1"]
    assert [t.path for t in expand(model, "*")] == ["0"]
    assert not [target for target in list_targets(model) if target.startswith("1")]
    with torch.no_grad(), record(model, list_targets(model), keep="all") as rec:
        model(x)
    assert [value.tolist() for value in rec.all("0.0:forward:return")] == [first.tolist(), second.tolist()]


# --- properties: a target's parts parse back; any text expands or names the problem ---

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ..typed_text import PIECES, SETTINGS, TYPED, specs_and_short_forms  # noqa: E402

_PATHS = ("", "stem", "blocks", "blocks.0", "blocks.2", "fc")  # SmallNet's, blocks: a Sequential
_TARGET_PIECES = st.lists(
    st.sampled_from((*PIECES, *_PATHS[1:], "a:b", "*", "blocks.*", ":forward:")), max_size=10
)


class _OddNames(torch.nn.Module):
    """SmallNet with a ModuleDict whose keys a target could misread: a ':' and 'grad'."""

    def __init__(self):
        super().__init__()
        self.net = SmallNet()
        self.heads = torch.nn.ModuleDict({"a:b": torch.nn.ReLU(), "grad": torch.nn.Identity()})

    def forward(self, x):
        return self.heads["grad"](self.heads["a:b"](self.net(x)))


@SETTINGS
@given(st.sampled_from(_PATHS), specs_and_short_forms(), st.booleans(), st.sampled_from(["{}", " {} "]))
def test_property_a_target_s_path_method_and_spec_expand_back(path, spec_and_text, grad, around):
    spec, spec_text = spec_and_text
    if spec_text.endswith(".grad"):
        return  # (a chain ending in '.grad' is the gradient's suffix, as the docs say)
    text = around.format(f"{path}:forward:{spec_text}" + (".grad" if grad else ""))
    (target,) = expand(SmallNet(), text)
    assert (target.path, target.method, target.spec, target.grad, target.output) == (
        path,
        "forward",
        spec,
        grad,
        False,
    )
    assert target.text == text.strip().removesuffix(".grad")


@SETTINGS
@given(st.one_of(TYPED, _TARGET_PIECES.map("".join)))
def test_property_any_text_expands_or_is_an_error_that_names_it_and_records_nothing(text):
    model = _OddNames()
    code = {kind: kind.forward.__code__ for kind in (SmallNet, torch.nn.Linear, torch.nn.ReLU)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a method the module replaces: said, not asked here)
        try:
            targets = expand(model, text)
        except bcrecord.BcrecordError as error:
            assert str(error)
            with pytest.raises(bcrecord.BcrecordError):
                with bcrecord.torch.record(model, [text]):
                    pass
        else:
            assert targets and all(
                isinstance(t.spec, (Local, Return, bcrecord.Attribute, bcrecord.Call, bcrecord.Expr))
                for t in targets
            )
    assert {kind: kind.forward.__code__ for kind in code} == code


#: Submodule names torch accepts (no '.'): ':', 'grad', glob and index characters among letters.
_ODD_NAMES = (
    st.lists(st.sampled_from([*"ab0:*?[]@- ", "grad", "forward", "return", "\uff58"]), min_size=1, max_size=5)
    .map("".join)
    .filter(
        lambda name: (
            name == name.strip() and name.strip(":") == name and not hasattr(torch.nn.Sequential, name)
        )
    )
)


@SETTINGS
@given(_ODD_NAMES, _ODD_NAMES)
def test_property_every_target_list_targets_lists_expands_to_its_path_and_records(outer, inner):
    model = torch.nn.Sequential()
    model.add_module(outer, torch.nn.Sequential())
    model.get_submodule(outer).add_module(inner, torch.nn.Tanh())
    path = f"{outer}.{inner}"
    listed = bcrecord.torch.list_targets(model)
    assert path in listed
    for text in listed:
        assert [t.text for t in expand(model, text)] == [text]
    ((target,),) = [expand(model, text) for text in listed if text == path]
    assert (target.path, target.method, target.output) == (path, "forward", True)
    x = torch.randn(2)
    with torch.no_grad(), bcrecord.torch.record(model, listed) as rec:
        y = model(x)
    assert torch.equal(rec[f"{path}:forward:return"], y)


def test_a_glob_target_reads_the_model_s_submodules_once(monkeypatch):
    # The check for an IME's full-width ':' matched every glob target against every submodule
    # twice more, though it has no full-width character: record(resnet50, 'layer*.*:forward:out')
    # took 37% longer to enter and exit.
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    reads = []
    named_modules = torch.nn.Module.named_modules

    def counted(self, *args, **kwargs):
        reads.append(self is model)
        return named_modules(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "named_modules", counted)
    assert [t.path for t in expand_all(model, ["*.*:forward:return"])["*.*:forward:return"]] == ["0.0", "0.1"]
    assert new_matches(model, "*.*:forward:return", {"0.0", "0.1"}) == []
    assert reads.count(True) == 2  # one each (4 each before)


def test_the_modules_listed_once_each_are_made_from_every_path_s_list_as_torch_lists_them():
    # A set-up walks every path of the model's modules (warn_shared); its globs' list, each
    # module at its first path, is made from that one, not walked again.
    from bcrecord.torch.targets import _resolving

    shared = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    model = torch.nn.Sequential(
        shared, torch.nn.Sequential(torch.nn.Tanh(), shared), shared[1], torch.nn.ReLU()
    )

    def listed(pairs):
        return [(path, id(module)) for path, module in pairs]

    with _resolving(model):
        every = named_modules(model, remove_duplicate=False)
        once = named_modules(model)
    assert listed(every) == listed(model.named_modules(remove_duplicate=False))
    assert listed(once) == listed(model.named_modules())
    assert [path for path, _ in once] == ["", "0", "0.0", "0.1", "0.1.0", "1", "1.0", "3"]

    class OwnList(torch.nn.Sequential):  # a class listing its modules its own way: walked again
        def named_modules(self, memo=None, prefix="", remove_duplicate=True):
            yield prefix, self

    hiding = torch.nn.Sequential(OwnList(torch.nn.ReLU()), torch.nn.Tanh())
    with _resolving(hiding):
        assert [path for path, _ in named_modules(hiding, remove_duplicate=False)] == ["", "0", "1"]
        assert listed(named_modules(hiding)) == listed(hiding.named_modules())


def test_a_glob_checks_the_method_of_each_class_it_matches_once(monkeypatch):
    # What a glob's target records is a method of the module's class: 16 Bottlenecks' forward
    # was checked 16 times (a tenth of a whole-resnet set-up). A class whose method a glob
    # passes over (here a forward(*args)) is passed over at each of its instances.
    from bcrecord.torch import targets

    class Spread(torch.nn.Module):
        def forward(*args):
            return args[1]

    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2), Spread(), torch.nn.Linear(2, 2), Spread(), torch.nn.ReLU()
    )
    checked = []
    takes_instance = targets.takes_instance
    monkeypatch.setattr(
        targets, "takes_instance", lambda f: checked.append(f.__qualname__) or takes_instance(f)
    )
    assert [t.path for t in expand(model, "*:forward:return")] == ["0", "2", "4"]
    assert checked == [
        "Linear.forward",
        "test_a_glob_checks_the_method_of_each_class_it_matches_once.<locals>.Spread.forward",
        "ReLU.forward",
    ]
    with pytest.raises(
        bcrecord.NotPatchableError, match=r"^Spread at '3': forward takes no positional argument"
    ):
        expand(model, "3:forward:return")


def test_a_record_block_walks_the_model_once_as_it_starts_and_once_as_it_ends(monkeypatch):
    # Its globs' list, warn_shared's list of every path, and the check for modules added
    # at the end (every glob matched again) were three walks and a match more: a sixth of a
    # whole-resnet set-up. An end that finds the same modules at the same paths matches nothing.
    from bcrecord.torch import record, targets

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.ReLU()))
    model.append(model[0])  # one module at two paths
    walks, matches = [], []
    walked, match = targets._walked, targets._match
    monkeypatch.setattr(targets, "_walked", lambda root, flag: walks.append(flag) or walked(root, flag))
    monkeypatch.setattr(targets, "_match", lambda root, glob: matches.append(glob) or match(root, glob))
    with torch.no_grad(), record(model, ["*", "1.*:forward:return"]) as rec:
        model(torch.ones(1, 2))
    assert walks == [False, False] and matches == ["*", "1.*"]
    assert rec.keys() == ["0:forward:return", "1.0:forward:return", "1:forward:return"]
    walks.clear(), matches.clear()
    with pytest.warns(bcrecord.RecordingWarning, match=r"the module at '3' \(matching '\*'\) was added"):
        with record(model, ["*"]):
            model.append(torch.nn.Tanh())  # added: the glob is matched again, and it says so
    assert walks == [False, False, True] and matches == ["*", "*"]
    walks.clear(), matches.clear()
    with record(model, ["0", "1.0:forward:return"]):  # no glob: nothing to match again at the end
        pass
    assert walks == [False] and matches == ["0", "1.0"]


def test_jump_spans_reads_the_version_table_s_jumps_so_an_async_for_is_its_one_loop(monkeypatch):
    # On 3.14 END_ASYNC_FOR carries a label that is no jump (for monitoring: it goes on to the
    # next instruction); _jump_spans took every label argument for a jump, so an async for had
    # a second loop ending there. (3.14 has no torch here: checked by hand, see the commit.)
    # It now asks the version table, as the core analysis does: an opcode the table calls
    # no jump (JUMP_BACKWARD, below, as if it were one) makes no span.
    import dataclasses

    from bcrecord._versions import current
    from bcrecord.analysis import instructions
    from bcrecord.torch import targets

    async def f(xs):
        total = 0
        async for x in xs:
            total += x
        return total

    items = instructions(f.__code__)
    loops, _ = targets._jump_spans(f.__code__)
    ends = [items[end].name for _, end in loops]
    assert "END_ASYNC_FOR" not in ends and ends.count("JUMP_BACKWARD") == 1
    start, end = loops[ends.index("JUMP_BACKWARD")]
    adds = [k for k, item in enumerate(items) if getattr(item, "arg", None) == "total" and k > start]
    assert start < adds[0] < end  # the body's `total += x` is inside the loop
    table = dataclasses.replace(current(), pseudo_jumps=current().pseudo_jumps | {"JUMP_BACKWARD"})
    monkeypatch.setattr(targets, "current", lambda: table)
    assert [items[end].name for _, end in targets._jump_spans(f.__code__)[0]].count("JUMP_BACKWARD") == 0


def test_a_target_of_a_submodule_named_with_a_space_after_a_colon_keeps_its_path_in_its_text():
    # The spaces around every ':' were dropped from a target's text ('layer1.0 : forward : out'),
    # those in a path's own name too: 'a.a: a:forward:return' gave the text 'a.a:a:forward:return',
    # which names no submodule, so create_feature_extractor refused the target list_targets listed.
    model = torch.nn.Sequential()
    model.add_module("a", torch.nn.Sequential())
    model.a.add_module("a: a", torch.nn.Tanh())
    text = "a.a: a:forward:return"
    assert text in bcrecord.torch.list_targets(model)
    assert [(t.text, t.path) for t in expand(model, text)] == [(text, "a.a: a")]
    x = torch.randn(2)
    assert torch.equal(bcrecord.torch.create_feature_extractor(model, [text])(x)[text], torch.tanh(x))


def test_a_path_is_looked_up_among_registered_modules_first_then_through_attributes(monkeypatch):
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Sequential(), torch.nn.ReLU())
            self._hidden = {"head": torch.nn.Tanh()}  # (not registered: no submodule path)

        @property
        def head(self):
            return self._hidden["head"]

    model = Holder()
    wrapped = torch.nn.DataParallel(model)

    def refused(self, target):
        raise AssertionError(f"get_submodule({target!r}) called for a registered path")

    with monkeypatch.context() as patched:
        patched.setattr(torch.nn.Module, "get_submodule", refused)
        # An empty Sequential is found, though false; through the wrapper, and by its own path in it.
        assert module_at(model, "body.0") is model.body[0]
        assert module_at(wrapped, "body.1") is model.body[1]
        assert module_at(wrapped, "module.body.1") is model.body[1]
    # A module only an attribute gives is found as get_submodule finds it; a missing one is not.
    assert module_at(model, "head") is model._hidden["head"]
    with pytest.raises(bcrecord.TargetError, match="no submodule 'body.2'"):
        module_at(model, "body.2")


def test_modules_are_listed_as_named_modules_lists_them_also_below_a_class_that_lists_its_own():
    class Listing(torch.nn.Sequential):
        """Lists a module it holds unregistered (in its __dict__), as its own."""

        def named_modules(self, memo=None, prefix="", remove_duplicate=True):
            yield from super().named_modules(memo, prefix, remove_duplicate)
            yield f"{prefix}.extra" if prefix else "extra", self.__dict__["extra"]

    inner = Listing(torch.nn.ReLU())
    inner.__dict__["extra"] = torch.nn.Identity()
    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, inner, shared, Listing(torch.nn.Tanh()))
    model[3].__dict__["extra"] = shared
    for flag in (True, False):
        expected = list(model.named_modules(remove_duplicate=flag))
        assert named_modules(model, remove_duplicate=flag) == expected
        assert named_modules(inner, remove_duplicate=flag)[-1] == ("extra", inner.__dict__["extra"])
    listed = dict(named_modules(model))
    assert listed["1.extra"] is inner.__dict__["extra"] and listed["3.extra"] is shared and "2" not in listed
