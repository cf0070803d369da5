"""Specification of the Hugging Face Trainer callback (ridgescope.integrations.transformers).

Scenario: a tiny GPT-2 built from a config (no model hub), trained by an unmodified ``Trainer``
for 4 steps on random tokens on the CPU, with ``callbacks=[RidgescopeCallback(...)]``. The
truth comes from torch and the Trainer: the model's parameters (GPT-2 ties the output layer to
the token embedding: one storage), the optimizer's state tensors, the Trainer's global step and
its log history."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

from ridgescope.integrations.transformers import RidgescopeCallback  # noqa: E402

STEPS = 4
VOCAB, SEQ, BATCH = 256, 32, 4


class RandomTokens(torch.utils.data.Dataset):
    """Random token ids, held in one tensor made before training (as a tokenised corpus is)."""

    def __init__(self, n: int = 32, seed: int = 0) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LogRecorder(TrainerCallback):
    """A callback listed before ridgescope's: it sees what the report_to integrations see."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.records.append(dict(logs))


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def train(out: Path, callbacks: list, **overrides) -> Trainer:
    args = dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH,
                use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                disable_tqdm=True, seed=0, dataloader_num_workers=0)
    args.update(overrides)
    trainer = Trainer(model=tiny_gpt2(), args=TrainingArguments(**args),
                      train_dataset=RandomTokens(), callbacks=callbacks)
    trainer.train()
    return trainer


def state_tensors(trainer: Trainer) -> list[torch.Tensor]:
    return [v for s in trainer.optimizer.state.values() for v in s.values()
            if isinstance(v, torch.Tensor)]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    recorder, callback = LogRecorder(), RidgescopeCallback(tensorboard=True)
    trainer = train(out, [recorder, callback], report_to=["tensorboard"])
    return out, trainer, callback, recorder


# transformers 5 calls it activation checkpointing (gradient_checkpointing is its deprecated
# alias, a FutureWarning); 4.x has only the old name
CHECKPOINTING = ("activation_checkpointing"
                 if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
                 else "gradient_checkpointing")


def checkpointing(**kwargs) -> dict:
    options = {CHECKPOINTING: True}
    if kwargs:
        options[f"{CHECKPOINTING}_kwargs"] = kwargs
    return options


def is_checkpointing(model) -> bool:
    return (model.is_activation_checkpointing if hasattr(type(model), "is_activation_checkpointing")
            else model.is_gradient_checkpointing)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf-gc")
    callback = RidgescopeCallback()
    trainer = train(out, [callback], bf16=True, **checkpointing())
    return out, trainer, callback


def assert_exact_run(trainer: Trainer, callback: RidgescopeCallback) -> dict:
    """The checks both runs share: parameter and optimizer-state bytes exact, 4 steps,
    unknown under 1 % of the peak, the peak in the Trainer's log history."""
    assert callback.error is None
    data = callback.report.to_dict()
    model = trainer.model
    # parameters: tied weights are one storage, counted once
    assert model.lm_head.weight is model.transformer.wte.weight
    params = list(model.parameters())  # torch de-duplicates the tied one
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    assert data["model"]["parameter_bytes"] == param_bytes
    assert data["peak"]["by_category"]["parameter"] == param_bytes
    # optimizer state: two moments per trainable element, and one step counter per tensor
    trainable = sum(p.numel() * p.element_size() for p in params if p.requires_grad)
    steps = [s["step"] for s in trainer.optimizer.state.values()]
    counters = sum(t.numel() * t.element_size() for t in steps)
    state_bytes = sum(t.numel() * t.element_size() for t in state_tensors(trainer))
    assert state_bytes == 2 * trainable + counters and len(steps) == len(params)
    assert data["optimizer"]["state_bytes"] == state_bytes
    assert data["peak"]["step"] >= 1  # the steady state, after the state was made
    assert data["peak"]["by_category"]["optimizer_state"] == state_bytes
    # 4 steps, as the Trainer counted them (the zero_grad after the last step opens a 5th)
    assert trainer.state.global_step == STEPS
    assert [s["step"] for s in data["steps"] if s["complete"]] == list(range(STEPS))
    assert data["optimizer"]["steps"] == STEPS
    # unknown < 1 % of the peak
    peak = data["peak"]
    assert peak["by_category"]["unknown"] < 0.01 * peak["bytes"], peak["by_category"]
    # the Trainer's log history holds the peak and its composition
    logged = [r for r in trainer.state.log_history if "ridgescope/peak_bytes" in r]
    assert len(logged) == 1
    assert logged[0]["ridgescope/peak_bytes"] == peak["bytes"]
    assert logged[0]["ridgescope/peak_step"] == peak["step"]
    assert {k.removeprefix("ridgescope/peak/"): v for k, v in logged[0].items()
            if k.startswith("ridgescope/peak/")} == peak["by_category"]
    return data


def test_a_trainer_run_is_tracked_exactly_and_its_peak_reaches_the_logs(plain):
    """Given the tiny GPT-2 trained 4 steps with the callback, then the report is exact
    (parameters with the tied weights once, optimizer state = 2x trainable + step counters,
    4 steps, unknown < 1 %), the peak is in the log history, and the callbacks listed before
    ridgescope's (where the report_to integrations are) got it as one log record."""
    out, trainer, callback, recorder = plain
    data = assert_exact_run(trainer, callback)
    phases = {p["phase"] for p in callback.report.phases()}
    assert {"forward", "backward", "optimizer_step", "zero_grad"} <= phases
    figures = [r for r in recorder.records if "ridgescope/peak_bytes" in r]
    assert len(figures) == 1 and figures[0]["ridgescope/peak_bytes"] == data["peak"]["bytes"]
    # the trace and its HTML report are in output_dir
    assert callback.trace == out / "ridgescope.rstrace" and callback.trace.stat().st_size > 0
    html = (out / "ridgescope.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "GPT2LMHeadModel" in html


def test_the_peak_reaches_a_report_to_integration(plain):
    """Given report_to=["tensorboard"] (the Trainer's own TensorBoardCallback), then its event
    file holds the peak: the record went through Trainer.log to every integration."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, trainer, callback, _ = plain
    peak = callback.report.peak
    runs = [p for p in (out / "runs").iterdir() if p.name != "ridgescope"]
    assert len(runs) == 1
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    logged = events.Scalars("train/ridgescope/peak_bytes")
    assert [e.value for e in logged] == [float(peak["bytes"])]  # exact in float32 below 16 MiB
    assert peak["bytes"] < 2 ** 24
    assert [e.step for e in logged] == [STEPS]
    # and the callback's own TensorBoard scalars sit beside it, one per step, at the
    # Trainer's step numbers (its step n is the report's step n - 1)
    ours = EventAccumulator(str(out / "runs" / "ridgescope"), size_guidance={"tensors": 0})
    ours.Reload()
    steps = [t.step for t in ours.Tensors("ridgescope/peak_bytes")]
    assert steps == [s["step"] + 1 for s in callback.report.steps]


def test_tracking_changes_no_result(plain, tmp_path):
    """Given the same training without the callback, then every logged loss and gradient norm
    is bitwise identical."""
    _, tracked, _, _ = plain
    untracked = train(tmp_path, [])

    def curve(trainer):
        return [(r["loss"], r["grad_norm"]) for r in trainer.state.log_history if "loss" in r]

    assert curve(tracked) == curve(untracked) and len(curve(untracked)) == STEPS
    assert all(math.isfinite(loss) for loss, _ in curve(untracked))


@pytest.mark.filterwarnings("error:.*checkpointing.*:FutureWarning")  # no deprecated name used
def test_activation_checkpointing_and_bf16_show_recompute_phases(checkpointed):
    """Given activation_checkpointing=True (gradient_checkpointing before transformers 5) and
    bf16=True (autocast on the CPU), then the same exactness holds, and the report has
    recompute phases inside backward."""
    _, trainer, callback = checkpointed
    assert trainer.args.bf16 and is_checkpointing(trainer.model)
    assert_exact_run(trainer, callback)
    recompute = callback.report.phases("recompute")
    assert recompute, "checkpointed blocks are recomputed during backward"
    assert {p["parent"] for p in recompute} == {"backward"}
    assert {p["step"] for p in recompute} == set(range(STEPS))
    # the recomputed activations are tagged as such
    assert any(p["peak_by_category"]["activation"] > 0 for p in recompute)


@pytest.mark.skipif(CHECKPOINTING != "activation_checkpointing",
                    reason="every_n_layers arrived with transformers 5's activation checkpointing")
def test_checkpointing_every_second_layer_recomputes_half_as_often(checkpointed, tmp_path):
    """Given transformers 5's every_n_layers=2 on the 2-layer model, then only the first layer
    is checkpointed: each step recomputes half as often as with every layer checkpointed, and
    the run is as exact."""
    every_layer = checkpointed[2]  # the callback only: a trainer in a variable is a second model
    callback = RidgescopeCallback()
    trainer = train(tmp_path, [callback], bf16=True, **checkpointing(every_n_layers=2))
    assert_exact_run(trainer, callback)
    per_step = lambda cb: [len([p for p in cb.report.phases("recompute") if p["step"] == s])  # noqa: E731
                           for s in range(STEPS)]
    assert per_step(callback) == [n // 2 for n in per_step(every_layer)] and per_step(callback)[0] > 0


def test_a_second_session_is_not_started_under_an_enclosing_one(tmp_path, capsys):
    """Given a Trainer run inside ``rs.track`` (or ``ridgescope run``), then the callback stands
    aside (sessions do not nest), says so, and the enclosing session records the run."""
    import ridgescope as rs

    callback = RidgescopeCallback()
    with rs.track(out=tmp_path / "outer.rstrace") as outer:
        train(tmp_path / "run", [callback], max_steps=1)
    assert callback.report is None and "already tracking" in callback.error
    assert "stands aside" in capsys.readouterr().err
    assert outer.report().to_dict()["optimizer"]["steps"] == 1


def test_a_training_that_runs_out_of_memory_keeps_its_report(tmp_path):
    """Given a simulated capacity below the run's peak, when the Trainer raises the
    out-of-memory error (it has no event for that), then ``callback.finish()`` ends tracking
    and returns the report, which explains the failure."""
    import ridgescope as rs

    callback = RidgescopeCallback(capacity="2MiB")
    with pytest.raises(torch.OutOfMemoryError):
        train(tmp_path, [callback])
    report = callback.finish()
    assert rs.active_session() is None
    ooms = report.to_dict()["ooms"]
    assert len(ooms) == 1 and ooms[0]["live_bytes"] + ooms[0]["request_bytes"] > 2 * 1024 ** 2
    assert callback.finish() is report  # once


def test_an_internal_error_never_reaches_the_training(tmp_path, monkeypatch):
    """Given the analysis failing at the end of training (an internal error), then training
    completes, one warning says tracking stopped, and no session is left running."""
    import ridgescope as rs
    from ridgescope.integrations import _run

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(_run.Report, "from_trace", broken)
    callback = RidgescopeCallback()
    with pytest.warns(RuntimeWarning, match=r"stopped tracking after an internal error "
                                            r"\(RuntimeError: injected\); training continues"):
        trainer = train(tmp_path, [callback], max_steps=2)
    assert trainer.state.global_step == 2 and rs.active_session() is None
    assert callback.error == "RuntimeError: injected" and callback.report is None
