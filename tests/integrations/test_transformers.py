"""The transformers recipe (docs/transformers.md) on tiny models (GPT-2, BERT, Llama, T5, ViT), no downloads.

Attention probabilities are recorded inside the module-level ``eager_attention_forward``
(a local, ``attn_weights``), with per-layer keys, and compared with what
``output_attentions=True`` returns; the pre-softmax scores, which no hook can see, are
compared with an independent computation; hidden states inside and between blocks
with ``output_hidden_states=True`` and with recomputation.
"""

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the transformers tox env installs transformers")

from transformers.models.bert import modeling_bert  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2  # noqa: E402

import bcrecord  # noqa: E402
from bcrecord import runtime  # noqa: E402
from bcrecord.errors import NotPatchableError, TargetError  # noqa: E402
from bcrecord.integrations.transformers import attention_recorder  # noqa: E402
from bcrecord.torch import list_targets, record  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning", "error::bcrecord.errors.RecordingWarning")

GPT2_ATTENTION_CODE = modeling_gpt2.eager_attention_forward.__code__
BERT_ATTENTION_CODE = modeling_bert.eager_attention_forward.__code__
GPT2_BLOCK_CODE = modeling_gpt2.GPT2Block.forward.__code__
GPT2_ATTN_FORWARD = modeling_gpt2.GPT2Attention.forward
BERT_LAYER_CODE = modeling_bert.BertLayer.forward.__code__


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return transformers.BertModel(config).eval()


def assert_clean():
    assert modeling_gpt2.eager_attention_forward.__code__ is GPT2_ATTENTION_CODE
    assert modeling_bert.eager_attention_forward.__code__ is BERT_ATTENTION_CODE
    assert modeling_gpt2.GPT2Block.forward.__code__ is GPT2_BLOCK_CODE
    assert modeling_gpt2.GPT2Attention.forward is GPT2_ATTN_FORWARD
    assert modeling_bert.BertLayer.forward.__code__ is BERT_LAYER_CODE
    assert not runtime.is_active()


def test_gpt2_attention_probabilities_equal_output_attentions(gpt2):
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with (
        attention_recorder(gpt2, ["attn_weights@0", "attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        torch.no_grad(),
    ):
        out = gpt2(ids, output_attentions=True)
    assert patch.keys == (
        "*:eager_attention_forward:attn_weights@0",
        "*:eager_attention_forward:attn_weights@2",
    )
    for i in range(2):
        probs = attn[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@2"]
        assert probs.shape == (2, 2, 7, 7)
        assert torch.equal(probs, out.attentions[i])
        assert len(attn.all(f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@2")) == 1
        # causal: nothing above the diagonal, rows sum to one
        assert torch.all(probs.triu(1) == 0)
        assert torch.allclose(probs.sum(-1), torch.ones(2, 2, 7))
    assert_clean()


def test_gpt2_scores_before_softmax_equal_an_independent_computation(gpt2):
    ids = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(2))
    with (
        attention_recorder(gpt2, ["attn_weights@0", "attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        torch.no_grad(),
    ):
        out = gpt2(ids, output_hidden_states=True)  # no output_attentions: recorded all the same
    for i, block in enumerate(gpt2.transformer.h):
        with torch.no_grad():
            qkv = block.attn.c_attn(block.ln_1(out.hidden_states[i]))
            q, k, _ = (t.view(1, 6, 2, 16).transpose(1, 2) for t in qkv.split(32, dim=2))
            scores = q @ k.transpose(-1, -2) / math.sqrt(16)
        recorded = attn[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@0"]
        assert torch.allclose(recorded, scores, atol=1e-5)
        causal = torch.full((6, 6), float("-inf")).triu(1)
        expected = torch.softmax(scores + causal, dim=-1)
        assert torch.allclose(
            attn[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@2"], expected, atol=1e-6
        )
    assert_clean()


def test_gpt2_hidden_states_between_and_inside_blocks(gpt2):
    ids = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(3))
    targets = ["transformer.h.*", "transformer.h.*:forward:hidden_states@1"]
    with record(gpt2, targets) as rec, torch.no_grad():
        out = gpt2(ids, output_hidden_states=True)
    hidden = out.hidden_states  # embeddings, after block 0, ..., ln_f(after the last block)
    assert torch.equal(rec["transformer.h.0:forward:return"], hidden[1])
    with torch.no_grad():
        assert torch.allclose(
            gpt2.transformer.ln_f(rec["transformer.h.1:forward:return"]), hidden[2], atol=1e-6
        )
        for i, block in enumerate(gpt2.transformer.h):
            # hidden_states@1: the residual stream after attention, before the MLP
            causal = torch.full((5, 5), float("-inf")).triu(1)[None, None]
            after_attention = hidden[i] + block.attn(block.ln_1(hidden[i]), attention_mask=causal)[0]
            assert torch.allclose(
                rec[f"transformer.h.{i}:forward:hidden_states@1"], after_attention, atol=1e-6
            )
    assert rec.keys_of("transformer.h.*") == [
        "transformer.h.0:forward:return",
        "transformer.h.1:forward:return",
    ]
    assert_clean()


def test_gpt2_generate_records_every_decoding_step(gpt2):
    ids = torch.randint(1, 100, (1, 4), generator=torch.Generator().manual_seed(4))
    key = "transformer.h.1.attn:eager_attention_forward:attn_weights@2"
    with (
        attention_recorder(gpt2, ["attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        torch.no_grad(),
    ):
        generated = gpt2.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    shapes = [tuple(v.shape) for v in attn.all(key)]
    assert generated.shape == (1, 7)
    # the prompt, then one query row per new token over a growing cache
    assert shapes == [(1, 2, 4, 4), (1, 2, 1, 5), (1, 2, 1, 6)]
    with torch.no_grad():
        full = gpt2(generated[:, :6], output_attentions=True).attentions[1]
    assert torch.allclose(attn.all(key)[2][0, :, 0], full[0, :, 5], atol=1e-6)
    assert_clean()


def test_generate_keeps_each_step_s_cache_as_it_was_then(gpt2):
    # generate() fills one cache object step after step: a recorded output's
    # past_key_values is a copy of the cache as it was, not the cache at the end.
    ids = torch.randint(1, 100, (1, 4), generator=torch.Generator().manual_seed(6))
    with record(gpt2, ["transformer"]) as rec, torch.no_grad():
        generated = gpt2.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    outputs = rec.all("transformer:forward:return")
    assert [out.past_key_values.get_seq_length() for out in outputs] == [4, 5, 6]
    for length, out in zip([4, 5, 6], outputs, strict=True):
        with torch.no_grad():  # the same prefix in one forward: its cache, computed anew
            fresh = gpt2(generated[:, :length], use_cache=True).past_key_values
        for kept, expected in zip(out.past_key_values.layers, fresh.layers, strict=True):
            assert torch.allclose(kept.keys, expected.keys, atol=1e-6)
            assert torch.allclose(kept.values, expected.values, atol=1e-6)
    assert_clean()


def test_record_options_reach_the_tensors_of_a_recorded_cache(gpt2):
    # record(..., dtype=, to=, reduce=, grad=) applied to a recorded output's logits but left
    # the copy of its cache as the default copy makes it: under to='cpu' on a GPU, every step's
    # cache copy (the bulk of the output) stayed on the GPU.
    ids = torch.randint(1, 100, (1, 4), generator=torch.Generator().manual_seed(6))
    with record(gpt2, ["transformer"], dtype=torch.float64) as rec, torch.no_grad():
        generated = gpt2.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    outputs = rec.all("transformer:forward:return")
    assert [out.past_key_values.get_seq_length() for out in outputs] == [4, 5, 6]
    for length, out in zip([4, 5, 6], outputs, strict=True):
        assert out.last_hidden_state.dtype == torch.float64
        with torch.no_grad():
            fresh = gpt2(generated[:, :length], use_cache=True).past_key_values
        for kept, expected in zip(out.past_key_values.layers, fresh.layers, strict=True):
            assert kept.keys.dtype == kept.values.dtype == torch.float64
            assert torch.allclose(kept.keys, expected.keys.double(), atol=1e-6)
    with record(gpt2, ["transformer"], reduce=lambda t: t[..., :1]) as rec, torch.no_grad():
        gpt2.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    kept = rec.all("transformer:forward:return")[1].past_key_values
    assert kept.get_seq_length() == 5 and kept.layers[0].keys.shape == (1, 2, 5, 1)
    # Outside no_grad: 'deepcopy' failed (copy.deepcopy refuses a tensor in the autograd graph),
    # and grad=True kept the cache's tensors out of the graph.
    with (
        record(gpt2, ["transformer"], copy="deepcopy") as copied,
        record(gpt2, ["transformer"], grad=True) as kept,
    ):
        out = gpt2(ids, use_cache=True)
    live = out.past_key_values.layers[0].keys
    deep = copied["transformer:forward:return"].past_key_values.layers[0].keys
    assert torch.equal(deep, live) and not deep.requires_grad
    in_graph = kept["transformer:forward:return"].past_key_values.layers[0].keys
    weight = gpt2.transformer.h[0].attn.c_attn.weight
    (through_kept,) = torch.autograd.grad(in_graph.sum(), weight, retain_graph=True)
    (through_live,) = torch.autograd.grad(live.sum(), weight)
    assert torch.equal(through_kept, through_live)
    assert_clean()


def test_bert_attention_with_padding_and_hidden_states(bert):
    ids = torch.randint(0, 100, (2, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    specs = ["attn_weights@0", "attn_weights@1", "attn_weights@2"]
    targets = [
        "encoder.layer.*",
        "encoder.layer.*.intermediate",
        "encoder.layer.*.attention.self:forward:query_layer",
    ]
    with (
        attention_recorder(bert, specs) as patch,
        bcrecord.recording(only=[patch]) as attn,
        record(bert, targets) as rec,
        torch.no_grad(),
    ):
        out = bert(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    for i, layer in enumerate(bert.encoder.layer):
        owner = f"encoder.layer.{i}.attention.self:eager_attention_forward"
        probs = attn[f"{owner}:attn_weights@2"]
        assert torch.equal(probs, out.attentions[i])
        # padded keys get no attention in the second sequence
        assert torch.all(probs[1, :, :, 4:] == 0) and torch.all(probs[0] > 0)
        scores, masked = attn[f"{owner}:attn_weights@0"], attn[f"{owner}:attn_weights@1"]
        q = rec[f"encoder.layer.{i}.attention.self:forward:query_layer@0"]
        with torch.no_grad():
            k = layer.attention.self.key(out.hidden_states[i]).view(2, 6, 2, 16).transpose(1, 2)
            inter = layer.intermediate(layer.attention(out.hidden_states[i], attention_mask=None)[0])
        assert torch.allclose(scores, q @ k.transpose(-1, -2) / 4.0, atol=1e-5)
        assert torch.equal(masked[0], scores[0]) and torch.all(masked[1, :, :, 4:] < -1e30)
        assert torch.equal(rec[f"encoder.layer.{i}:forward:return"], out.hidden_states[i + 1])
        if i == 0:  # the first sequence has no padding: its intermediate is mask-independent
            assert torch.allclose(
                rec[f"encoder.layer.{i}.intermediate:forward:return"][0], inter[0], atol=1e-5
            )
    assert_clean()


def test_module_outputs_are_what_the_decorated_forwards_return(bert):
    # BertModel.forward is wrapped (can_return_tuple, output capturing), BertLayer's by
    # gradient checkpointing: a module path records what the module returned, as a hook sees it.
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(2))
    seen = {}
    hooks = [
        module.register_forward_hook(lambda m, a, out, path=path: seen.setdefault(path, out))
        for path, module in [("", bert), ("encoder.layer.0", bert.encoder.layer[0])]
    ]
    try:
        with record(bert, ["", "encoder.layer.0"]) as rec, torch.no_grad():
            out = bert(ids, output_hidden_states=True, return_dict=False)
    finally:
        for hook in hooks:
            hook.remove()
    root = rec[":forward:return"]
    assert isinstance(out, tuple) and isinstance(root, tuple) and len(root) == len(out) == 3
    assert torch.equal(root[0], out[0]) and len(root[2]) == len(out[2]) == 3  # the hidden states too
    assert torch.equal(rec["encoder.layer.0:forward:return"], seen["encoder.layer.0"])
    extracted = bcrecord.torch.create_feature_extractor(bert, [""])(ids, output_hidden_states=True)[""]
    assert "hidden_states" in extracted  # added by the wrapper
    # A ModelOutput holds its fields as items and as attributes: both the copies.
    with record(bert, [""]) as rec, torch.no_grad():
        out = bert(ids)
    kept = rec[":forward:return"]
    out.last_hidden_state.add_(100)
    assert kept.last_hidden_state is kept["last_hidden_state"]
    assert torch.equal(kept.last_hidden_state + 100, out.last_hidden_state)
    assert_clean()


def test_a_model_of_several_attention_functions_running_sdpa_is_told_so_first():
    # It was told "give function= to choose one", and only then that it runs SDPA.
    encoder = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    decoder = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=100, add_cross_attention=True, is_decoder=True
    )
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    model = transformers.EncoderDecoderModel(config).eval()
    with pytest.raises(
        TargetError, match=r"EncoderDecoderModel runs attn_implementation='sdpa' in .* it never calls "
    ):
        attention_recorder(model, ["attn_weights@2"])
    assert_clean()
    # Where one of them runs eagerly, function= chooses it: asked for, as before.
    model.encoder.set_attn_implementation("eager")
    with pytest.raises(TargetError, match=r"call 2 eager_attention_forward functions .*; give function= to"):
        attention_recorder(model, ["attn_weights@2"])
    bert = modeling_bert.eager_attention_forward
    with (
        attention_recorder(model, ["attn_weights@2"], function=bert) as patch,
        bcrecord.recording(only=[patch]) as attn,
        torch.no_grad(),
    ):
        model(input_ids=torch.randint(0, 100, (1, 4)), decoder_input_ids=torch.randint(0, 100, (1, 3)))
    assert attn.keys() == ["encoder.encoder.layer.0.attention.self:eager_attention_forward:attn_weights@2"]
    assert_clean()


def test_only_eager_attention_runs_the_python_function():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        vocab_size=50,
        attn_implementation="sdpa",
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (1, 4))
    # Patched by hand, the function records nothing: SDPA never calls it.
    with (
        bcrecord.patch_function(
            modeling_bert.eager_attention_forward, ["attn_weights@2"], name="bert"
        ) as patch,
        bcrecord.recording(only=[patch]) as attn,
        torch.no_grad(),
    ):
        model(ids)
    assert len(attn) == 0
    # attention_recorder says so before anything is patched, and how to switch.
    with pytest.raises(TargetError) as refused:
        attention_recorder(model, ["attn_weights@2"])
    assert str(refused.value) == (
        "attention_recorder: BertModel runs attn_implementation='sdpa' in encoder.layer.0.attention.self, "
        "encoder.layer.1.attention.self: it never calls "
        "transformers.models.bert.modeling_bert.eager_attention_forward, so nothing would be recorded; "
        "load it with attn_implementation='eager' (from_pretrained(..., attn_implementation='eager')) or "
        "call model.set_attn_implementation('eager') first"
    )
    assert_clean()
    model.set_attn_implementation("eager")
    with (
        attention_recorder(model, ["attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        torch.no_grad(),
    ):
        out = model(ids, output_attentions=True)
    key = "encoder.layer.1.attention.self:eager_attention_forward:attn_weights@2"
    assert torch.equal(attn[key], out.attentions[1])
    assert_clean()


def test_attention_recorder_names_the_function_it_cannot_find():
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(TargetError, match=r"Sequential's attention modules call 0 eager_attention_forward"):
        attention_recorder(plain, ["attn_weights@2"])
    gpt2_function = modeling_gpt2.eager_attention_forward
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=8,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=8,
            vocab_size=10,
            attn_implementation="eager",
        )
    )
    with pytest.raises(TargetError) as refused:
        attention_recorder(bert, ["attn_weights@2"], function=gpt2_function)
    assert str(refused.value) == (
        "attention_recorder: no module of BertModel calls "
        "transformers.models.gpt2.modeling_gpt2.eager_attention_forward; its attention modules call: "
        "transformers.models.bert.modeling_bert.eager_attention_forward"
    )
    assert_clean()


def test_the_docs_name_the_transformers_version_whose_lines_they_show():
    """docs/transformers.md gives modeling_gpt2.py's line numbers for a transformers version it
    names: that is the version tested, and the listing's lines are that version's."""
    import re
    from pathlib import Path

    import transformers

    text = (Path(__file__).resolve().parents[2] / "docs" / "transformers.md").read_text()
    named = re.search(r"line of `modeling_gpt2.py` \(transformers (\d+\.\d+)\)", text).group(1)
    assert named == ".".join(transformers.__version__.split(".")[:2])
    shown = re.search(r"```\n(local +attn_weights .*?)```", text, flags=re.S).group(1)
    listing = bcrecord.targets(modeling_gpt2.eager_attention_forward)
    assert [line for line in str(listing).splitlines() if "attn_weights " in line] == shown.splitlines()


@pytest.mark.parametrize(
    ("given", "error", "message"),
    [
        (
            dict(model="gpt2"),
            TypeError,
            "attention_recorder takes a model, an nn.Module instance, not str: 'gpt2'",
        ),
        (dict(function=5), NotPatchableError, "5, an int: only Python functions can be patched"),
        (dict(function="eager"), NotPatchableError, "'eager', a str: only Python functions can be patched"),
    ],
)
def test_attention_recorder_refuses_what_is_no_model_or_no_function_naming_it(gpt2, given, error, message):
    # Both were an AttributeError from inside: 'str' object has no attribute 'named_modules',
    # 'int' object has no attribute '__module__'.
    arguments = {"model": gpt2, "specs": ["attn_weights@2"], **given}
    with pytest.raises(error) as refused:
        attention_recorder(**arguments)
    assert str(refused.value) == message
    assert_clean()
    with attention_recorder(gpt2, ["attn_weights@2"]) as patch, bcrecord.recording(only=[patch]) as rec:
        gpt2(torch.tensor([[1, 2, 3]]))
    assert rec["transformer.h.1.attn:eager_attention_forward:attn_weights@2"].shape == (1, 2, 3, 3)
    assert_clean()


def test_the_documented_recipe_runs_and_prints_what_it_shows(capsys):
    """docs/transformers.md: its python blocks run in order; output blocks match what they print."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "transformers.md").read_text()
    fences = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    namespace = {"__name__": "transformers_recipe"}
    checked = ran = 0
    for (lang, body), (next_lang, next_body) in zip(fences, fences[1:] + [("none", "")], strict=True):
        if lang != "python":
            continue
        exec(compile(body, "docs/transformers.md", "exec"), namespace)
        ran += 1
        printed = capsys.readouterr().out
        if next_lang == "":  # the output block that follows it
            normalise = lambda s: [
                re.sub(r"\s+\d+:\d+\s+", " ", line).split() for line in s.strip().splitlines()
            ]
            assert normalise(printed) == normalise(next_body)
            checked += 1
    assert ran == 8 and checked == 6
    assert_clean()


def test_gradient_checkpointing_records_the_recomputation_too(gpt2):
    # docs/transformers.md, "Gradient checkpointing": two values per layer for a step with a backward.
    model = transformers.GPT2LMHeadModel(gpt2.config)
    model.load_state_dict(gpt2.state_dict())
    model.gradient_checkpointing_enable()
    model.train()
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.manual_seed(3)
    hooked = []
    hook = model.transformer.h[0].register_forward_hook(lambda module, args, output: hooked.append(output))
    with record(model, ["transformer.h.0"]) as layer, attention_recorder(model, ["attn_weights@2"]) as patch:
        with bcrecord.recording(only=[patch]) as rec:
            out = model(ids, labels=ids)
            forward_only = {key: len(rec.all(key)) for key in rec.keys()}
            out.loss.backward()
    hook.remove()
    keys = [f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@2" for i in range(2)]
    assert forward_only == dict.fromkeys(keys, 1)
    assert {key: len(rec.all(key)) for key in rec.keys()} == dict.fromkeys(keys, 2)
    # The recomputation stops after the last tensor the backward needs: the block's output once.
    assert len(layer.all("transformer.h.0:forward:return")) == len(hooked) == 1
    for key in keys:  # the recomputation replays the forward (dropout's random state included)
        first, again = rec.all(key)
        assert torch.equal(first, again)
    assert modeling_gpt2.eager_attention_forward.__code__ is GPT2_ATTENTION_CODE


def test_vit_patch_embeddings_cls_token_per_layer_and_a_feature_extractor_after_hidden_states():
    # output_hidden_states=True leaves transformers' capture hooks (they return None) on each
    # layer: an extractor made afterwards returned the same values, with a RecordingWarning
    # per layer that this file's filter turns into an error.
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        attn_implementation="eager",
    )
    vit = transformers.ViTModel(config).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    targets = ["embeddings.patch_embeddings", "layers.*"]
    with (
        attention_recorder(vit, ["nn.functional.softmax()"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        record(vit, targets) as rec,
        torch.no_grad(),
    ):
        out = vit(pixels, output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        patches = vit.embeddings.patch_embeddings.projection(pixels).flatten(2).transpose(1, 2)
    assert torch.allclose(rec["embeddings.patch_embeddings:forward:return"], patches, atol=1e-6)
    for i in range(2):
        layer = rec[f"layers.{i}:forward:return"]
        assert layer.shape == (2, 17, 32)  # the CLS token, then 16 patches
        assert torch.equal(layer[:, 0], out.hidden_states[i + 1][:, 0])
        probs = attn[f"layers.{i}.attention:eager_attention_forward:nn.functional.softmax()@0"]
        assert torch.equal(probs, out.attentions[i])
    assert vit.layers[1]._forward_hooks  # (transformers' capture hooks)
    features = bcrecord.torch.create_feature_extractor(vit, ["layers.1", "embeddings"])(pixels)
    assert torch.allclose(features["layers.1"], out.hidden_states[2], atol=1e-6)
    assert torch.allclose(features["embeddings"], out.hidden_states[0], atol=1e-6)
    assert_clean()


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: two query heads per key/value head
        vocab_size=100,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).eval()


def _rotated(x, positions, theta):
    """Llama's rotary embedding, computed here from its definition (half-split pairs)."""
    half = x.shape[-1] // 2
    angles = positions[:, None] * theta ** (-torch.arange(0, half).float() / half)
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def test_llama_rmsnorm_rotary_queries_keys_and_grouped_query_probabilities(llama):
    ids = torch.randint(3, 100, (2, 6), generator=torch.Generator().manual_seed(8))
    owners = "model.layers.*.self_attn:forward:"
    targets = [f"{owners}query_states@1", f"{owners}key_states@1", "model.layers.*.input_layernorm"]
    with (
        attention_recorder(llama, ["key_states@0", "attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        record(llama, targets) as rec,
        torch.no_grad(),
    ):
        out = llama(ids, output_attentions=True, output_hidden_states=True)
    theta, eps = llama.config.rope_parameters["rope_theta"], llama.config.rms_norm_eps
    causal = torch.full((6, 6), float("-inf")).triu(1)
    for i, layer in enumerate(llama.model.layers):
        x = out.hidden_states[i]
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * layer.input_layernorm.weight
        assert torch.allclose(rec[f"model.layers.{i}.input_layernorm:forward:return"], normed, atol=1e-5)
        with torch.no_grad():
            q = layer.self_attn.q_proj(normed).view(2, 6, 4, 8).transpose(1, 2)
            k = layer.self_attn.k_proj(normed).view(2, 6, 2, 8).transpose(1, 2)
        q, k = _rotated(q, torch.arange(6), theta), _rotated(k, torch.arange(6), theta)
        assert torch.allclose(rec[f"model.layers.{i}.self_attn:forward:query_states@1"], q, atol=1e-5)
        assert torch.allclose(rec[f"model.layers.{i}.self_attn:forward:key_states@1"], k, atol=1e-5)
        owner = f"model.layers.{i}.self_attn:eager_attention_forward"
        repeated = attn[f"{owner}:key_states@0"]  # repeat_kv: key/value head 0 for query heads 0, 1
        assert repeated.shape == (2, 4, 6, 8)
        assert torch.equal(repeated[:, 0], repeated[:, 1]) and torch.allclose(
            repeated[:, 2], k[:, 1], atol=1e-5
        )
        expected = torch.softmax(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8) + causal, -1)
        assert torch.allclose(attn[f"{owner}:attn_weights@2"], expected, atol=1e-6)
        assert torch.equal(attn[f"{owner}:attn_weights@2"], out.attentions[i])
    assert_clean()


def test_compiled_llama_records_what_eager_does_and_lm_head_breaks_more_than_its_local(llama):
    # README, torch.compile: values are correct; a site in a class's method (nn.Linear's, for
    # lm_head) breaks the graph wherever the class runs, the model's own local in one place.
    import torch._dynamo

    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(17))
    targets = [":forward:logits", "model.layers.*", "model.layers.0.self_attn:forward:query_states@1"]
    with record(llama, targets) as eager, torch.no_grad():
        expected = llama(ids)
    counters = torch._dynamo.utils.counters
    breaks = {}
    for chosen in (targets, [":forward:logits"], ["lm_head"]):
        torch._dynamo.reset()
        counters.clear()
        with record(llama, chosen) as rec, torch.no_grad():
            out = torch.compile(llama, backend="eager")(ids)
        assert torch.allclose(out.logits, expected.logits, atol=1e-6)
        # (A break inside transformers' output-capturing wrapper makes it break once more, at its
        # ContextVar, after a call with output_attentions=True has left its capture hooks.)
        breaks[chosen[0]] = sum(
            n for reason, n in counters["graph_break"].items() if "bcrecord_probe" in reason
        )
        if chosen is targets:
            assert rec.keys() == eager.keys()
            for key in eager.keys():
                assert torch.allclose(rec[key], eager[key], atol=1e-6), key
    torch._dynamo.reset()
    assert breaks["lm_head"] > breaks[":forward:logits"]
    assert_clean()


def test_attention_recorder_names_a_compiled_decoder_layer_s_attention_by_the_path_record_gives(llama):
    # Regional compilation, layers[i] = torch.compile(layers[i]): the attention recorder's keys
    # were 'model.layers.0._orig_mod.self_attn:eager_attention_forward:...', where record()
    # names the module 'model.layers.0.self_attn' (and the docs' keys raised KeyError).
    import torch._dynamo

    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(5))
    with attention_recorder(llama, ["attn_weights@2"]) as patch, bcrecord.recording(only=[patch]) as eager:
        with torch.no_grad():
            llama(ids)
    compiled = copy.deepcopy(llama)
    layers = compiled.model.layers
    torch._dynamo.reset()
    for i in range(len(layers)):
        layers[i] = torch.compile(layers[i], backend="eager")
    with attention_recorder(compiled, ["attn_weights@2"]) as patch, bcrecord.recording(only=[patch]) as rec:
        with record(compiled, ["model.layers.*.self_attn"]) as outputs, torch.no_grad():
            compiled(ids)
    torch._dynamo.reset()
    owner = "model.layers.0.self_attn"
    assert sorted(rec.keys()) == sorted(eager.keys())
    assert f"{owner}:forward:return" in outputs.keys()
    probs = rec[f"{owner}:eager_attention_forward:attn_weights@2"]
    assert torch.equal(probs, eager[f"{owner}:eager_attention_forward:attn_weights@2"])


def test_attention_recorder_names_the_modules_of_a_wrapped_model_by_the_paths_record_gives(gpt2):
    # A model compiled whole (or in nn.DataParallel): the keys were
    # '_orig_mod.transformer.h.0.attn:eager_attention_forward:...' ('module.transformer...'),
    # where record() of the same wrapper names the module 'transformer.h.0.attn'.
    import torch._dynamo

    ids = torch.randint(3, 100, (1, 5), generator=torch.Generator().manual_seed(17))
    with torch.no_grad():
        attentions = gpt2(ids, output_attentions=True).attentions
    torch._dynamo.reset()
    for wrapped in (torch.nn.DataParallel(gpt2), torch.compile(gpt2, backend="eager")):
        with (
            attention_recorder(wrapped, ["attn_weights@2"]) as patch,
            bcrecord.recording(only=[patch]) as attn,
            record(wrapped, ["transformer.h.*.attn"]) as outputs,
            torch.no_grad(),
        ):
            wrapped(ids)
        owners = [key.split(":")[0] for key in outputs.keys()]
        assert owners == ["transformer.h.0.attn", "transformer.h.1.attn"]
        assert attn.keys() == [f"{owner}:eager_attention_forward:attn_weights@2" for owner in owners]
        for owner, expected in zip(owners, attentions, strict=True):
            assert torch.equal(attn[f"{owner}:eager_attention_forward:attn_weights@2"], expected)
    torch._dynamo.reset()
    assert_clean()


@pytest.mark.parametrize(
    "strategy",
    [
        {"do_sample": False},
        {"do_sample": True, "top_k": 0},
        {"num_beams": 3, "do_sample": False},
        {"do_sample": False, "use_cache": False},
        {"do_sample": False, "cache_implementation": "static"},
    ],
    ids=["greedy", "sampling", "beams", "no-cache", "static-cache"],
)
def test_llama_generate_same_tokens_and_each_step_s_values(llama, strategy):
    ids = torch.randint(3, 100, (2, 4), generator=torch.Generator().manual_seed(9))
    options = dict(max_new_tokens=3, min_new_tokens=3, pad_token_id=0, **strategy)
    torch.manual_seed(11)
    plain = llama.generate(ids, **options)
    probs_key = "model.layers.1.self_attn:eager_attention_forward:attn_weights@2"
    keys_key = "model.layers.0.self_attn:forward:key_states@1"
    torch.manual_seed(11)
    with (
        attention_recorder(llama, ["attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        record(llama, ["model", keys_key]) as rec,
        torch.no_grad(),
    ):
        generated = llama.generate(ids, **options)
    assert torch.equal(generated, plain)  # sampling's random state untouched
    rows = 2 * strategy.get("num_beams", 1)
    cached = strategy.get("use_cache", True)
    # (a static cache holds every position a forward reads: the prompt and the tokens fed back)
    columns = [6] * 3 if "cache_implementation" in strategy else [4, 5, 6]
    queries = [4, 1, 1] if cached else [4, 5, 6]
    assert [tuple(p.shape) for p in attn.all(probs_key)] == [
        (rows, 4, q, c) for q, c in zip(queries, columns, strict=True)
    ]
    if "num_beams" in strategy:  # the prompt's step: each sequence's beams next to each other
        prompt = attn.all(probs_key)[0]
        assert all(torch.equal(prompt[row], prompt[row - row % 3]) for row in range(6))
        assert not torch.equal(prompt[0], prompt[3])
    steps = rec.all("model:forward:return")
    if not cached:
        assert [step.past_key_values for step in steps] == [None] * 3
        return
    if "cache_implementation" in strategy:  # no attention to the positions not filled yet
        for filled, probs in zip([4, 5, 6], attn.all(probs_key), strict=True):
            assert torch.all(probs[..., filled:] == 0) and torch.all(probs[..., :filled].sum(-1) > 0.99)
    for filled, step, new_keys in zip([4, 5, 6], steps, rec.all(keys_key), strict=True):
        kept = step.past_key_values.layers[0].keys  # the cache as it was at that step
        assert kept.shape[0] == rows and int(step.past_key_values.get_seq_length()) == filled
        assert torch.equal(kept[:, :, filled - new_keys.shape[2] : filled], new_keys)
        assert torch.all(kept[:, :, filled:] == 0)  # (the static cache: not filled yet)
    assert_clean()


def test_t5_masked_scores_in_the_encoder_only_with_a_mask_that_masks_a_position():
    # docs/transformers.md: T5's attn_weights@2 (the scores plus the mask) is assigned in the
    # encoder only with an attention_mask that masks something; one of all ones is dropped.
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, attn_implementation="eager"
    )
    encoder = transformers.T5EncoderModel(config).eval()
    ids = torch.randint(2, 100, (2, 5), generator=torch.Generator().manual_seed(11))
    padded = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    found = {}
    for name, mask in [("none", None), ("ones", torch.ones_like(ids)), ("padded", padded)]:
        with (
            attention_recorder(encoder, ["attn_weights@2"]) as patch,
            bcrecord.recording(only=[patch]) as attn,
            torch.no_grad(),
        ):
            encoder(ids, attention_mask=mask)
        found[name] = list(attn.keys())
    key = "encoder.block.0.layer.0.SelfAttention:eager_attention_forward:attn_weights@2"
    assert found == {"none": [], "ones": [], "padded": [key]}
    assert_clean()


def test_t5_encoder_once_then_decoder_self_and_cross_attention_per_step():
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=100,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        attn_implementation="eager",
    )
    t5 = transformers.T5ForConditionalGeneration(config).eval()
    source = torch.randint(2, 100, (2, 6), generator=torch.Generator().manual_seed(10))
    plain = t5.generate(source, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    probs = "eager_attention_forward:nn.functional.softmax()@0"
    with (
        attention_recorder(t5, ["nn.functional.softmax()", "attn_weights@2"]) as patch,
        bcrecord.recording(only=[patch]) as attn,
        record(t5, ["encoder", "decoder"]) as rec,
        torch.no_grad(),
    ):
        generated = t5.generate(source, max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert torch.equal(generated, plain)
    assert len(rec.all("encoder:forward:return")) == 1
    shapes = lambda key: [tuple(value.shape) for value in attn.all(key)]
    assert shapes(f"encoder.block.1.layer.0.SelfAttention:{probs}") == [(2, 4, 6, 6)]
    assert shapes(f"decoder.block.1.layer.0.SelfAttention:{probs}") == [
        (2, 4, 1, 1),
        (2, 4, 1, 2),
        (2, 4, 1, 3),
    ]
    assert shapes(f"decoder.block.1.layer.1.EncDecAttention:{probs}") == [(2, 4, 1, 6)] * 3
    # T5's attn_weights@2 is the scores plus the mask: only where there is one (no encoder key)
    assert not [key for key in attn.keys() if key.startswith("encoder") and key.endswith("attn_weights@2")]
    caches = [step.past_key_values for step in rec.all("decoder:forward:return")]
    assert [c.self_attention_cache.get_seq_length() for c in caches] == [1, 2, 3]
    assert [c.cross_attention_cache.get_seq_length() for c in caches] == [6, 6, 6]
    with torch.no_grad():  # the last step's cross-attention, computed anew in one forward
        full = t5(source, decoder_input_ids=generated[:, :3], output_attentions=True)
    last = attn.all(f"decoder.block.1.layer.1.EncDecAttention:{probs}")[2]
    assert torch.allclose(last[:, :, 0], full.cross_attentions[1][:, :, 2], atol=1e-6)
    # Beam search: the encoder runs once, on the batch as given; the decoder on batch x beams.
    with (
        attention_recorder(t5, ["nn.functional.softmax()"]) as patch,
        bcrecord.recording(only=[patch]) as beams,
        torch.no_grad(),
    ):
        t5.generate(source, max_new_tokens=3, min_new_tokens=3, num_beams=2, do_sample=False)
    assert [v.shape[0] for v in beams.all(f"encoder.block.1.layer.0.SelfAttention:{probs}")] == [2]
    assert [v.shape[0] for v in beams.all(f"decoder.block.1.layer.1.EncDecAttention:{probs}")] == [4] * 3
    assert_clean()


def test_sequence_classification_logits_before_and_after_pooling_on_the_last_real_token():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        pad_token_id=0,
        num_labels=3,
    )
    model = transformers.LlamaForSequenceClassification(config).eval()
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])  # the second padded on the right
    with record(model, ["score", ":forward:pooled_logits"]) as rec, torch.no_grad():
        out = model(ids)
    per_token = rec["score:forward:return"]
    assert per_token.shape == (2, 4, 3)
    assert torch.equal(rec[":forward:pooled_logits@0"], out.logits)
    assert torch.equal(out.logits, torch.stack([per_token[0, 3], per_token[1, 1]]))
    assert_clean()


def test_stop_after_last_ends_each_forward_so_generate_fails_as_documented(llama):
    # docs/transformers.md, "Generation": the model returns None where generate needs logits.
    ids = torch.randint(3, 100, (1, 4), generator=torch.Generator().manual_seed(12))
    with record(llama, ["model.layers.0"], stop_after_last=True) as rec, torch.no_grad():
        assert llama(ids) is None
        with pytest.raises(AttributeError, match="'NoneType' object"):
            llama.generate(ids, max_new_tokens=2, pad_token_id=0)
    assert rec["model.layers.0:forward:return"].shape == (1, 4, 32)
    # A recorded submodule inside the model called runs whole: the outer forward needs its output.
    with torch.no_grad():
        expected = llama(ids).logits
        with record(llama.model, ["layers.0"], stop_after_last=True) as rec:
            assert torch.equal(llama(ids).logits, expected)
    assert rec["layers.0:forward:return"].shape == (1, 4, 32)
    assert_clean()


def test_attention_functions_named_as_variants_are_found_too():
    # TimesFM's modules call simple_eager_attention_forward (Llama 4's vision tower
    # vision_eager_attention_forward, ...): attention_recorder said the model called none,
    # and refused the function given as function= too.
    from transformers.models.timesfm import modeling_timesfm

    torch.manual_seed(0)
    config = transformers.TimesFmConfig(
        patch_length=4,
        context_length=16,
        horizon_length=4,
        hidden_size=16,
        intermediate_size=32,
        head_dim=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        attn_implementation="eager",
    )
    model = transformers.TimesFmModelForPrediction(config).eval()
    series = [torch.randn(16, generator=torch.Generator().manual_seed(13)), torch.ones(12)]
    for function in (None, modeling_timesfm.simple_eager_attention_forward):
        with (
            attention_recorder(model, ["nn.functional.softmax()"], function=function) as patch,
            bcrecord.recording(only=[patch]) as attn,
            torch.no_grad(),
        ):
            out = model(past_values=series, output_attentions=True)
        for i in range(2):
            probs = attn[
                f"decoder.layers.{i}.self_attn:simple_eager_attention_forward:nn.functional.softmax()@0"
            ]
            assert probs.shape == (2, 2, 4, 4)  # 16 values in patches of 4
            assert torch.equal(probs, out.attentions[i])
    code = modeling_timesfm.simple_eager_attention_forward.__code__
    assert code is patch.original_code


def test_a_model_without_an_attention_function_is_told_the_target_that_records_it():
    # DeBERTa computes attention in its modules' forward: the message suggested a local
    # named attn_weights, which DeBERTa does not have; it now names a softmax call site there.
    torch.manual_seed(0)
    config = transformers.DebertaConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    model = transformers.DebertaModel(config).eval()
    with pytest.raises(TargetError) as refused:
        attention_recorder(model, ["attn_weights@2"])
    target = "encoder.layer.0.attention.self:forward:nn.functional.softmax()"
    assert str(refused.value) == (
        "attention_recorder: DebertaModel's attention modules call 0 eager_attention_forward functions "
        "(none); DebertaModel computes attention in its modules' forward: record the probabilities there, "
        f"e.g. bcrecord.torch.record(model, [{target!r}]) (and 1 more module whose forward calls a "
        "softmax); bcrecord.torch.list_targets(model) lists every target"
    )
    ids = torch.randint(3, 100, (1, 5), generator=torch.Generator().manual_seed(14))
    with record(model, [target]) as rec, torch.no_grad():
        out = model(ids, output_attentions=True)
    assert torch.equal(rec[f"{target}@0"], out.attentions[0])
    # A layer compiled in its place: the same target, not one under torch.compile's '_orig_mod'.
    model.encoder.layer[0] = torch.compile(model.encoder.layer[0], backend="eager")
    with pytest.raises(TargetError) as refused:
        attention_recorder(model, ["attn_weights@2"])
    assert f"bcrecord.torch.record(model, [{target!r}])" in str(refused.value)
    # The model compiled whole: its messages named torch.compile's wrapper, OptimizedModule.
    with pytest.raises(TargetError, match=r"^attention_recorder: DebertaModel's attention modules"):
        attention_recorder(torch.compile(model, backend="eager"), ["attn_weights@2"])
    assert_clean()


def test_a_model_without_attention_is_told_so_not_sent_to_a_target_it_does_not_have():
    # Mamba computes no attention (no attention function, no softmax): the message suggested
    # '<path>:forward:attn_weights', which no module of it has.
    config = transformers.MambaConfig(
        vocab_size=50, hidden_size=16, state_size=4, num_hidden_layers=1, expand=2, conv_kernel=2
    )
    model = transformers.MambaModel(config).eval()
    with pytest.raises(TargetError) as refused:
        attention_recorder(model, ["attn_weights@2"])
    assert str(refused.value) == (
        "attention_recorder: MambaModel's attention modules call 0 eager_attention_forward functions "
        "(none); nor does any module's forward call a softmax: MambaModel may compute no attention; "
        "bcrecord.torch.list_targets(model) lists what it computes, to record with bcrecord.torch.record"
    )
    assert_clean()


def test_attention_modules_the_function_does_not_reach_are_named_with_a_target_that_does():
    # GIT's vision tower calls eager_attention_forward; its text layers compute attention in
    # their own forward. The patch recorded the vision tower's alone and said nothing.
    torch.manual_seed(0)
    tower = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    tower.update(image_size=8, patch_size=4)
    config = transformers.GitConfig(
        vision_config=tower,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        vocab_size=20,
        max_position_embeddings=16,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    model = transformers.GitForCausalLM(config).eval()
    text = "git.encoder.layer.0.attention.self:forward:nn.functional.softmax()"
    with pytest.warns(bcrecord.errors.RecordingWarning) as warned:
        patch = attention_recorder(model, ["attn_weights@2"])
    assert [str(w.message) for w in warned] == [
        "attention_recorder: 2 attention modules of GitForCausalLM (git.encoder.layer.0.attention.self, "
        "git.encoder.layer.1.attention.self) compute attention in their own forward, not through "
        "transformers.models.git.modeling_git.eager_attention_forward: this patch does not record them; "
        f"record the probabilities there, e.g. bcrecord.torch.record(model, [{text!r}])"
    ]
    ids = torch.tensor([[1, 5, 6]])
    pixels = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), patch, bcrecord.recording(only=[patch]) as attn, record(model, [text]) as rec:
        out = model(input_ids=ids, pixel_values=pixels, output_attentions=True)
    vision = "git.image_encoder.vision_model.encoder.layers.0.self_attn"
    assert list(attn.keys()) == [f"{vision}:eager_attention_forward:attn_weights@2"]
    # output_attentions gives the text layers' (image tokens and text): the suggested target is the first.
    assert torch.equal(rec[f"{text}@0"], out.attentions[0])
    assert not runtime.is_active()


def test_a_mixture_of_experts_records_its_experts_locals_only_with_the_eager_experts():
    # docs/transformers.md: under transformers 5's default grouped kernel the experts' Python
    # loop never runs (only their module's output is recorded); experts_implementation="eager" runs it.
    def mixtral(**options):
        config = transformers.MixtralConfig(
            vocab_size=50,
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
        )
        torch.manual_seed(0)
        return transformers.MixtralForCausalLM._from_config(
            config, attn_implementation="eager", **options
        ).eval()

    ids = torch.tensor([[1, 2, 3]])
    experts = "model.layers.0.mlp.experts"
    outputs = {}
    for options in ({}, {"experts_implementation": "eager"}):
        model = mixtral(**options)
        targets = [target for target in list_targets(model) if target.startswith(f"{experts}:")]
        with record(model, [experts, *targets]) as rec, torch.no_grad():
            model(ids)
        outputs[model.config._experts_implementation] = rec[f"{experts}:forward:return"]
        ran = [key for key in rec.keys() if key != f"{experts}:forward:return"]
        assert (len(ran) > 40) is bool(options), ran  # the loop's locals only where it ran
        if options:
            assert rec[f"{experts}:forward:final_hidden_states@0"].shape == (3, 16)
    assert sorted(outputs) == ["eager", "grouped_mm"]
    assert torch.allclose(outputs["eager"], outputs["grouped_mm"], atol=1e-5)
    assert_clean()


def test_training_mode_dropout_and_gradients_through_recorded_values(llama):
    model = transformers.LlamaForCausalLM(llama.config)
    model.load_state_dict(llama.state_dict())
    model.config.attention_dropout = 0.5
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    model.train()
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(15))
    probs_key = "model.layers.1.self_attn:eager_attention_forward:attn_weights@"
    torch.manual_seed(16)
    with (
        record(model, ["model.layers.1"], grad=True) as rec,
        attention_recorder(model, ["attn_weights@2", "attn_weights@3"]) as patch,
        bcrecord.recording(only=[patch], copy="none") as attn,  # (the values themselves, in the graph)
    ):
        out = model(ids)
    seen = {}
    hook = model.model.layers[1].register_forward_hook(
        lambda module, args, output: seen.setdefault(0, output)
    )
    torch.manual_seed(16)  # the same dropout masks: recording leaves the random state alone
    try:
        again = model(ids)
    finally:
        hook.remove()
    assert torch.equal(out.logits, again.logits)
    weight = model.model.layers[1].mlp.down_proj.weight
    recorded = rec["model.layers.1:forward:return"]
    (through_recorded,) = torch.autograd.grad(recorded.sum(), weight)
    (through_hooked,) = torch.autograd.grad(seen[0].sum(), weight)
    assert torch.allclose(through_recorded, through_hooked)
    dropped, kept = attn[probs_key + "3"], attn[probs_key + "2"]
    assert dropped.requires_grad and torch.any((dropped == 0) & (kept > 0))  # dropout dropped some
    survived = dropped != 0
    assert torch.allclose(dropped[survived], 2 * kept[survived])  # inverted dropout, p=0.5
    assert_clean()
