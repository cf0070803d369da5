"""Specification of the Lightning callback (ridgescope.integrations.lightning), with the
``lightning`` and the ``pytorch_lightning`` packages.

Scenario: a LightningModule whose ``training_step`` calls a submodule (not ``self(x)``), trained
4 steps on the CPU from a ``TensorDataset`` made before ``fit`` (the data a DataLoader's dataset
holds), under Lightning's automatic optimisation (the optimizer step receives a closure that
runs forward and backward), with one validation and a CSV logger. The truth comes from torch:
the module's parameters, the optimizer's state tensors, the dataset's tensors."""
from __future__ import annotations

import csv
import importlib
import pickle
from pathlib import Path

import pytest
import torch


def RidgescopeCallback(**options):  # noqa: N802 (the class, imported when a test first needs it)
    """ridgescope.integrations.lightning.RidgescopeCallback(**options). The integration imports
    Lightning (3.7 s): imported here, only the pytest worker that runs these tests pays it, not
    every worker that collects them."""
    from ridgescope.integrations.lightning import RidgescopeCallback as callback
    return callback(**options)

STEPS, BATCH = 4, 16
# Lightning's own deprecation of torch's LeafSpec (torch 2.14) is not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*")
PACKAGES = ["lightning", "pytorch_lightning"]


def framework(name: str):
    pl = pytest.importorskip(name)
    return pl if name == "pytorch_lightning" else importlib.import_module("lightning.pytorch")


def classifier(base: type) -> type:
    """The LightningModule class, derived from one package's ``LightningModule``."""

    class Classifier(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                           torch.nn.Linear(64, 4))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Classifier


def make_module(pl):
    torch.manual_seed(0)
    return classifier(pl.LightningModule)()


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(256, 32, generator=g),
                                          torch.randint(0, 4, (256,), generator=g))


def fit(pl, root, callbacks, **overrides):
    data = dataset()
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    module = make_module(pl)
    options = dict(max_steps=STEPS, accelerator="cpu", devices=1, default_root_dir=str(root),
                   logger=pl.loggers.CSVLogger(str(root)), enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                   val_check_interval=2, limit_val_batches=1, num_sanity_val_steps=0,
                   log_every_n_steps=1)
    options.update(overrides)
    trainer = pl.Trainer(**options)
    trainer.fit(module, loader, torch.utils.data.DataLoader(data, batch_size=BATCH))
    return trainer, module, data


@pytest.fixture(scope="module", params=PACKAGES)
def run(request, tmp_path_factory):
    pl = framework(request.param)
    callback = RidgescopeCallback(tensorboard=True)
    trainer, module, data = fit(pl, tmp_path_factory.mktemp(request.param), [callback])
    return pl, trainer, module, data, callback


def test_a_fit_is_tracked_exactly_with_the_dataset_as_input(run):
    """Given 4 training steps with the callback, then parameter and optimizer-state bytes are
    exact, there are 4 steps, the dataset's tensors (made before fit) are input, and unknown
    is under 1 % of the peak, the dataset included."""
    pl, trainer, module, data, callback = run
    assert callback.error is None and isinstance(callback, pl.Callback)
    report = callback.report.to_dict()
    peak = report["peak"]

    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    assert report["model"]["parameter_bytes"] == param_bytes
    assert peak["by_category"]["parameter"] == param_bytes
    optimizer = trainer.optimizers[0]
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    counters = sum(s["step"].numel() * s["step"].element_size() for s in optimizer.state.values())
    state_bytes = sum(t.numel() * t.element_size() for t in state)
    assert state_bytes == 2 * param_bytes + counters
    assert report["optimizer"]["state_bytes"] == state_bytes
    assert peak["by_category"]["optimizer_state"] == state_bytes

    assert trainer.global_step == STEPS
    assert [s["step"] for s in report["steps"] if s["complete"]] == list(range(STEPS))

    # the dataset's tensors: input, under their dataset's name, at their exact size
    held = {b["label"]: b for b in peak["top_blocks"] if b["label"].startswith("dataset ")}
    for i, t in enumerate(data.tensors):
        block = held[f"dataset TensorDataset.tensors[{i}]"]
        assert block["category"] == "input" and block["bytes"] == t.numel() * t.element_size()
    assert peak["by_category"]["input"] >= sum(t.numel() * t.element_size() for t in data.tensors)
    assert peak["by_category"]["unknown"] < 0.01 * peak["bytes"], peak["by_category"]


def test_phases_follow_lightnings_step(run):
    """Given automatic optimisation (forward and backward run inside optimizer.step's closure),
    then every step reads forward, backward, optimizer_step at the top level, the optimizer
    step being the update alone; and the validation is one eval phase."""
    _, _, _, _, callback = run
    for step in callback.report.steps[:STEPS]:
        top = [p["phase"] for p in step["phases"] if p["depth"] == 0 and p["phase"] != "eval"]
        assert [p for p in top if p != "zero_grad"] == ["forward", "backward", "optimizer_step"]
        optimizer_step = next(p for p in step["phases"] if p["phase"] == "optimizer_step")
        assert optimizer_step["allocated_bytes"] < step["peak_bytes"]
    evals = callback.report.phases("eval")
    assert len(evals) == STEPS // 2 and all(p["depth"] == 0 for p in evals)


def test_the_peak_reaches_the_trainers_loggers(run):
    """Given a CSV logger, then its metrics file holds the peak and its composition, and the
    trace, its HTML report and the TensorBoard scalars are in the Trainer's log_dir."""
    _, trainer, _, _, callback = run
    peak = callback.report.peak
    rows = list(csv.DictReader(open(trainer.logger.experiment.metrics_file_path)))
    logged = [r for r in rows if r.get("ridgescope/peak_bytes")]
    assert len(logged) == 1
    assert int(float(logged[0]["ridgescope/peak_bytes"])) == peak["bytes"]
    assert {c: int(float(logged[0][f"ridgescope/peak/{c}"])) for c in peak["by_category"]} == \
        peak["by_category"]
    # the trace and HTML report are in the Trainer's log_dir
    assert callback.trace == Path(trainer.log_dir) / "ridgescope.rstrace"
    assert callback.trace.with_suffix(".html").is_file()
    # and tensorboard=True put one scalar per step there, at the report's (= Lightning's
    # logging) step numbers
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(trainer.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    assert [t.step for t in events.Tensors("ridgescope/peak_bytes")] == \
        [s["step"] for s in callback.report.steps]


def test_tracking_changes_no_result(tmp_path):
    """Given the same fit with and without the callback, then the trained weights are bitwise
    identical."""
    pl = framework("lightning")
    _, with_cb, _ = fit(pl, tmp_path / "a", [RidgescopeCallback()])
    _, without, _ = fit(pl, tmp_path / "b", [])
    for a, b in zip(with_cb.parameters(), without.parameters()):
        assert torch.equal(a, b)


def test_each_ddp_rank_writes_its_own_trace(tmp_path):
    """Given DDP with two CPU processes (forked, gloo), then each rank writes its own trace
    (ridgescope.rank<N>.rstrace) with its parameters exact and both steps. (Spawned ranks
    receive the callback pickled: it pickles, see the next test.)"""
    pl = framework("lightning")
    root = tmp_path / "ddp"
    callback = RidgescopeCallback(dirpath=root)
    fit(pl, root, [callback], max_steps=2, devices=2, strategy="ddp_fork", logger=False,
        limit_val_batches=0)
    import ridgescope as rs

    module = make_module(pl)
    param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    for rank in (0, 1):
        report = rs.load(root / f"ridgescope.rank{rank}.rstrace").to_dict()
        assert report["model"]["parameter_bytes"] == param_bytes
        assert [s["step"] for s in report["steps"] if s["complete"]] == [0, 1]


def test_the_callback_pickles_for_spawned_ranks():
    """Given a callback before fit, then it survives pickling (ddp_spawn sends it to each
    rank) with its options."""
    callback = pickle.loads(pickle.dumps(RidgescopeCallback(tensorboard=True, capacity="1GiB")))
    assert callback._run.tensorboard is True and callback._run.capacity == "1GiB"
    assert callback.report is None and callback.error is None


def test_a_fit_that_runs_out_of_memory_keeps_its_report(tmp_path):
    """Given a simulated capacity below the run's peak, when fit raises the out-of-memory
    error, then Lightning's on_exception ended tracking and the report explains the failure."""
    import ridgescope as rs

    pl = framework("lightning")
    # room for the dataset and a forward and backward, not for the optimizer state
    callback = RidgescopeCallback(capacity="70KiB")
    with pytest.raises(torch.OutOfMemoryError):
        fit(pl, tmp_path, [callback])
    assert rs.active_session() is None
    ooms = callback.report.to_dict()["ooms"]
    assert len(ooms) == 1 and ooms[0]["live_bytes"] + ooms[0]["request_bytes"] > 70 * 1024
    assert ooms[0]["phase"] == "optimizer_step"


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_an_out_of_memory_error_in_data_set_up_is_shown_though_lightning_raises_another(tmp_path, capsys):
    """Given a LightningDataModule whose setup makes the training set and a simulated capacity
    below it, when the first DataLoader starts (its dataset is then counted) the allocation
    fails; Lightning's teardown then raises its own error ("Please call iter(combined_loader)
    first"), which hides the out-of-memory error from the user. Then the out-of-memory error
    is still in the chain, carries ridgescope's explanation as a note, the explanation is on
    stderr, and the report names the dataset as what filled the device."""
    pl = framework("lightning")

    class Data(pl.LightningDataModule):
        def setup(self, stage):
            g = torch.Generator().manual_seed(0)
            self.data = torch.utils.data.TensorDataset(torch.randn(2048, 32, generator=g),
                                                       torch.randint(0, 4, (2048,), generator=g))

        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.data, batch_size=BATCH)

    callback = RidgescopeCallback(capacity="64KiB")
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, default_root_dir=str(tmp_path),
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    with pytest.raises(Exception) as raised:
        trainer.fit(make_module(pl), datamodule=Data())
    chain, exc = [], raised.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    ooms = [e for e in chain if isinstance(e, torch.OutOfMemoryError)]
    assert ooms, [type(e).__name__ for e in chain]
    notes = getattr(ooms[0], "__notes__", [])
    assert any(n.startswith("ridgescope: out of memory; what was live and why:") for n in notes)
    assert "ridgescope: out of memory; what was live and why:" in capsys.readouterr().err
    oom = callback.report.to_dict()["ooms"]
    assert len(oom) == 1 and oom[0]["verdict"]["dominant_category"] == "input"
    assert oom[0]["by_category"]["input"] == 2048 * 32 * 4 + 2048 * 8  # the dataset's tensors
