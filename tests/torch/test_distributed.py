"""DistributedDataParallel: 2 ranks (gloo, CPU, spawned) each record their own values."""

import datetime
import gc
import os
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bcrecord
from bcrecord.torch import record

from ..commands import _env
from .models import SmallNet, TwoLayers, reference_smallnet


def _rank(rank, world, work, out_dir):
    """Run ``work(rank, out_dir)`` as one rank of a gloo group, then leave the group cleanly."""
    # The ranks meet through a file, not a TCP store: a port found free and closed again
    # may be taken before rank 0 binds it, and rank 0, the store's server, could leave
    # while rank 1 still talks to it.
    store = f"file://{os.path.join(out_dir, 'store')}"
    # A collective one rank never joins fails within two minutes (gloo's default: half an hour;
    # a rank slowed by a loaded machine still makes it).
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world, timeout=timeout)
    work(rank, out_dir)
    # A rank aborted once in CI ("terminate called without an active exception", gloo's
    # threads). So drop every DDP reducer (each holds the group) while the interpreter is
    # whole, and let no rank close its sockets while the other may still read.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    # What is tested ends here; torch's own teardown of gloo's threads is not, so skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(work, out_dir, world=2):
    mp.spawn(_rank, args=(world, work, str(out_dir)), nprocs=world, join=True)


def _record_both_ranks(rank, out_dir):
    torch.manual_seed(0)  # same weights on every rank
    net = SmallNet().eval()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    torch.manual_seed(100 + rank)  # a different batch per rank
    x = torch.randn(2, 3, 8, 8)
    with record(ddp, ["bn1", "module.blocks.1:forward:out@1"]) as rec:
        ddp(x)
    torch.save(
        {"x": x, "bn1": rec["bn1:forward:return"], "block": rec["module.blocks.1:forward:out@1"]},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


def test_each_rank_records_its_own_values(tmp_path):
    world = 2
    _spawn(_record_both_ranks, tmp_path, world)
    torch.manual_seed(0)
    net = SmallNet().eval()
    seen = []
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        expected = reference_smallnet(net, got["x"])
        assert torch.allclose(got["bn1"], expected["bn1"], atol=1e-5)
        assert torch.allclose(got["block"], expected["blocks.1.bn"], atol=1e-5)
        seen.append(got["bn1"])
    assert not torch.allclose(seen[0], seen[1])


def _gradients(rank, out_dir):
    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(100 + rank)  # a different batch per rank
    x = torch.randn(3, 4)
    grads, b_ran = {}, {}
    for way in ("extractor", "record"):
        torch.manual_seed(0)  # same weights on every rank
        net = TwoLayers()
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        if way == "extractor":  # stops early by default
            features = create_feature_extractor(ddp, {"b": "out"})(x)["out"]
        else:
            with record(ddp, ["b"], grad=True, stop_after_last=True) as rec:
                ddp(x)
            features = rec["b:forward:return"]
        features.sum().backward()
        grads[way] = net.a.weight.grad.clone()
        # Without autograd the early stop still ends the forward at 'a'.
        calls = []
        net.b.register_forward_hook(lambda *args, calls=calls: calls.append(1))
        with torch.no_grad():
            create_feature_extractor(ddp, ["a"])(x)
        b_ran[way] = len(calls)
    torch.save({"x": x, "grads": grads, "b_ran": b_ran}, os.path.join(out_dir, f"grads{rank}.pt"))


def test_stopping_early_never_skips_ddp_s_gradient_sync(tmp_path):
    # DDP readies its all-reduce when its forward returns: a forward stopped early left each
    # rank with its own gradients, silently. With autograd on it now runs whole there.
    world = 2
    _spawn(_gradients, tmp_path, world)
    got = [torch.load(tmp_path / f"grads{rank}.pt") for rank in range(world)]
    torch.manual_seed(0)
    net = TwoLayers()
    xs = torch.cat([g["x"] for g in got])
    net(xs).sum().backward()
    mean = net.a.weight.grad / world  # DDP averages the ranks' gradients (each a sum over 3 rows)
    for one in got:
        assert all(torch.allclose(grad, mean, atol=1e-6) for grad in one["grads"].values())
        assert one["b_ran"] == {"extractor": 0, "record": 0}


def _evaluated_on_one_rank(rank, out_dir):
    from bcrecord.torch import create_feature_extractor

    got = {}
    for way in ("record", "extractor", "inner"):
        torch.manual_seed(0)  # same weights on every rank
        net = SmallNet()  # batch norms: buffers DDP broadcasts before a forward after a training step
        ddp = torch.nn.parallel.DistributedDataParallel(net)
        torch.manual_seed(100 + rank)  # a different batch per rank
        x = torch.randn(2, 3, 8, 8)
        ddp(x).sum().backward()  # a training step
        calls = []
        net.fc.register_forward_hook(lambda *args, calls=calls: calls.append(1))
        bn1 = []
        with torch.no_grad():  # an evaluation on every rank, recorded on rank 0 only
            for _ in range(2):
                if rank == 1:
                    ddp(x)
                elif way == "record":
                    with record(ddp, ["bn1"], stop_after_last=True) as rec:
                        ddp(x)
                    bn1.append(rec["bn1:forward:return"])
                elif way == "extractor":
                    bn1.append(create_feature_extractor(ddp, ["bn1"])(x)["bn1"])
                else:
                    with record(net, ["bn1"], stop_after_last=True) as rec:
                        ddp(x)
                    bn1.append(rec["bn1:forward:return"])
        net.zero_grad()
        ddp(x).sum().backward()  # the next training step: it hung, rank 0 alone broadcasting
        got[way] = {"x": x, "bn1": bn1, "fc_ran": len(calls), "grad": net.stem.weight.grad.clone()}
    torch.save(got, os.path.join(out_dir, f"eval{rank}.pt"))


def test_a_forward_stopped_early_on_one_rank_without_autograd_leaves_the_next_step_in_step(tmp_path):
    # DDP's forward, as it returns without autograd, turns off the broadcast of buffers that
    # the next forward makes after a training step: stopped on rank 0 alone, rank 0 then
    # broadcast, rank 1 did not, and the next training step timed out. The first such forward
    # now runs whole; the one after it stops early.
    world = 2
    _spawn(_evaluated_on_one_rank, tmp_path, world)
    got = [torch.load(tmp_path / f"eval{rank}.pt") for rank in range(world)]
    for way in ("record", "extractor", "inner"):
        ranks = [one[way] for one in got]
        assert torch.allclose(ranks[0]["grad"], ranks[1]["grad"], atol=1e-6), way
        assert ranks[0]["fc_ran"] == 2 and ranks[1]["fc_ran"] == 3, way  # (the training step too)
        torch.manual_seed(0)
        net = SmallNet()  # in training mode, as the ranks' (no optimizer step: the same weights)
        with torch.no_grad():
            expected = net.bn1(net.stem(ranks[0]["x"]))  # the batch's own statistics
        assert len(ranks[0]["bn1"]) == 2, way
        assert all(torch.allclose(value, expected, atol=1e-5) for value in ranks[0]["bn1"]), way


def _inner_model_recorded(rank, out_dir):
    torch.manual_seed(0)  # same weights on every rank
    net = TwoLayers()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    torch.manual_seed(100 + rank)  # a different batch per rank
    x = torch.randn(3, 4)
    calls = []
    net.b.register_forward_hook(lambda *args: calls.append(1))
    grads = []
    for _ in range(2):  # a second step fails where the first one's reduction never finished
        # The model recorded is the one inside the DDP that runs it: it holds no DDP itself.
        with record(net, ["a"], stop_after_last=True, grad=True) as rec:
            out = ddp(x)
        out.sum().backward()
        grads.append(net.a.weight.grad.clone())
        net.zero_grad()
    torch.save(
        {"x": x, "a": rec["a:forward:return"], "grads": grads, "b_ran": len(calls)},
        os.path.join(out_dir, f"inner{rank}.pt"),
    )


def test_recording_the_model_inside_ddp_never_skips_its_gradient_sync(tmp_path):
    # record(ddp.module, stop_after_last=True) around ddp(x): the stop unwound DDP's forward
    # (ddp(x) gave None), the ranks kept their own gradients and the next step raised.
    world = 2
    _spawn(_inner_model_recorded, tmp_path, world)
    got = [torch.load(tmp_path / f"inner{rank}.pt") for rank in range(world)]
    torch.manual_seed(0)
    net = TwoLayers()
    xs = torch.cat([g["x"] for g in got])
    net(xs).sum().backward()
    mean = net.a.weight.grad / world
    for one in got:
        assert one["b_ran"] == 2
        assert torch.allclose(one["a"], net.a(one["x"]), atol=1e-6)
        assert all(torch.allclose(grad, mean, atol=1e-6) for grad in one["grads"])


def _parameter_gradients(rank, out_dir):
    torch.manual_seed(0)  # same weights on every rank
    net = TwoLayers()
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    torch.manual_seed(100 + rank)  # a different batch per rank
    x = torch.randn(3, 4)
    with record(ddp, ["module.a:forward:self.weight.grad"], grad=True) as rec:
        ddp(x).sum().backward()
    torch.save(
        {"x": x, "recorded": rec["module.a:forward:self.weight.grad"], "grad": net.a.weight.grad},
        os.path.join(out_dir, f"param{rank}.pt"),
    )


def test_a_parameter_s_gradient_is_this_rank_s_own_before_ddp_averages_it(tmp_path):
    # As the README says: what backward computes on this rank; .grad holds the ranks' mean.
    world = 2
    _spawn(_parameter_gradients, tmp_path, world)
    got = [torch.load(tmp_path / f"param{rank}.pt") for rank in range(world)]
    torch.manual_seed(0)
    net = TwoLayers()
    own = [torch.autograd.grad(net(one["x"]).sum(), net.a.weight)[0] for one in got]
    for one, mine in zip(got, own, strict=True):
        assert torch.allclose(one["recorded"], mine, atol=1e-6)
        assert torch.allclose(one["grad"], (own[0] + own[1]) / world, atol=1e-6)
    assert not torch.allclose(own[0], own[1])


def _training(rank, out_dir):
    import torch.nn.functional as F

    got = {}
    for name, options in [
        ("plain", {}),
        ("find_unused_parameters", {"find_unused_parameters": True}),
        ("static_graph", {"static_graph": True}),
        ("no_sync", {}),
    ]:
        torch.manual_seed(0)  # same weights on every rank
        net = TwoLayers()
        ddp = torch.nn.parallel.DistributedDataParallel(net, **options)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(100 + rank)  # a different batch per rank
        xs = [torch.randn(3, 4) for _ in range(3)]
        dicts = {path: dict(vars(module)) for path, module in net.named_modules()}
        expected = []
        targets = ["module.a", ":forward:x", "b:forward:return.grad", "module.a:forward:self.bias.grad"]
        with record(ddp, targets, grad=True, keep="all") as rec:
            for step, x in enumerate(xs):
                # An independent computation, by the functions the modules call (no module runs).
                wa, ba, wb, bb = (p.detach().clone().requires_grad_() for p in net.parameters())
                a = F.linear(x, wa, ba)
                own = torch.autograd.grad(F.linear(torch.relu(a), wb, bb).sum(), ba)[0]
                expected.append((a.detach(), own))
                optimizer.zero_grad()
                if name == "no_sync" and step == 0:
                    with ddp.no_sync():  # this step's gradients stay the rank's own
                        ddp(x).sum().backward()
                    continue
                ddp(x).sum().backward()
                optimizer.step()
        # A step stopped early (it runs whole under DDP with autograd on).
        with record(ddp, ["a"], stop_after_last=True) as stopped:
            out = ddp(xs[0])
        out.sum().backward()
        optimizer.step()
        got[name] = {
            "x": xs,
            "a": [value.detach() for value in rec.all("module.a:forward:return")],
            "expected": expected,
            "x@0": rec.all(":forward:x"),
            "b.grad": rec.all("b:forward:return.grad"),
            "bias.grad": rec.all("module.a:forward:self.bias.grad"),
            "stopped": stopped["a:forward:return"],
            "params": torch.cat([p.detach().flatten() for p in net.parameters()]),
            "as_before": {path: dict(vars(module)) for path, module in net.named_modules()} == dicts,
        }
    torch.save(got, os.path.join(out_dir, f"training{rank}.pt"))


def test_training_steps_under_ddp_options_record_each_rank_s_values_and_keep_the_ranks_in_sync(tmp_path):
    world = 2
    _spawn(_training, tmp_path, world)
    ranks = [torch.load(tmp_path / f"training{rank}.pt") for rank in range(world)]
    for name in ("plain", "find_unused_parameters", "static_graph", "no_sync"):
        for got in (one[name] for one in ranks):
            assert len(got["a"]) == 3
            assert all(
                torch.allclose(a, expected, atol=1e-6)
                for a, (expected, _) in zip(got["a"], got["expected"], strict=True)
            )
            assert all(map(torch.equal, got["x@0"], got["x"]))
            assert [grad.tolist() for grad in got["b.grad"]] == [[[1.0, 1.0]] * 3] * 3
            # This rank's own gradient, before DDP's mean (the README says so).
            assert len(got["bias.grad"]) == 3
            assert all(
                torch.allclose(grad, own, atol=1e-6)
                for grad, (_, own) in zip(got["bias.grad"], got["expected"], strict=True)
            )
            assert got["stopped"].shape == (3, 8) and got["as_before"]
        # Each rank its own values; the same parameters after the steps.
        assert not torch.allclose(ranks[0][name]["a"][0], ranks[1][name]["a"][0])
        assert not torch.allclose(ranks[0][name]["bias.grad"][0], ranks[1][name]["bias.grad"][0])
        assert torch.equal(ranks[0][name]["params"], ranks[1][name]["params"])


TRAIN = """
import torch
import torch.distributed as dist

def train_step(ddp, optimizer, x):
    optimizer.zero_grad()
    loss = ddp(x).square().mean()
    loss.backward()
    optimizer.step()
    return loss

dist.init_process_group("gloo")
torch.manual_seed(0)
ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
for step in range(3):
    train_step(ddp, optimizer, torch.full((2, 4), 10.0 * dist.get_rank() + step))
dist.barrier()
dist.destroy_process_group()
"""


def test_bcrecord_run_under_torchrun_saves_each_rank_to_its_own_directory(tmp_path):
    # The README's '-o runs/a/rank$RANK' reached every rank as 'runs/a/rank': the shell that
    # starts torchrun has no RANK. Quoted, bcrecord run reads it in each rank.
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    run = ["-m", "bcrecord", "run", "-r", "__main__:train_step:x", "-o", "runs/rank$RANK", "train.py"]
    result = subprocess.run(
        torchrun + run, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in (tmp_path / "runs").iterdir()) == ["rank0", "rank1"]
    for rank in (0, 1):
        saved = bcrecord.load(tmp_path / "runs" / f"rank{rank}")["__main__:train_step:x"]
        assert [value[0, 0].item() for value in saved] == [10.0 * rank + step for step in range(3)]
