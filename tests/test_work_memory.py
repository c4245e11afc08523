"""The meta probe's working memory for recurrent layers (`work_memory.py`): an RNN, LSTM or GRU given
meta tensors is not run step by step (level 3's 35_LSTM took a minute of a GPU host's CPU per probe);
its results' shapes follow from its configuration, exactly as running it gives them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernelevolve.spec import load_spec
from kernelevolve.work_memory import recurrent_meta


def _flat(out: object) -> list[torch.Size]:
    if isinstance(out, tuple):
        return [s for item in out for s in _flat(item)]
    assert isinstance(out, torch.Tensor)
    return [out.shape]


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("shape", [(3, 7, 5), (7, 5)], ids=["batched", "unbatched"])
def test_recurrent_results_on_meta_have_the_shapes_a_real_run_gives(
    cls: type, batch_first: bool, bidirectional: bool, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    projections = [0, 3] if cls is torch.nn.LSTM else [0]
    for proj in projections:
        extra = {"proj_size": proj} if proj else {}
        m = cls(5, 4, num_layers=2, batch_first=batch_first, bidirectional=bidirectional, **extra)
        x = torch.randn(*shape)
        with torch.no_grad():
            real = m(x)
        fake = recurrent_meta(m, (x.to("meta"),))
        assert _flat(fake) == _flat(real), (proj, _flat(fake), _flat(real))


def test_real_values_and_packed_sequences_are_left_to_the_layer() -> None:
    m = torch.nn.GRU(5, 4)
    assert recurrent_meta(m, (torch.randn(7, 2, 5),)) is None  # values: run it
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(7, 2, 5), [7, 5])
    assert recurrent_meta(m, (packed,)) is None


def test_a_specs_lstm_is_not_run_on_meta_and_its_memory_is_counted(tmp_path: Path) -> None:
    """The probe gives the spec's output shapes and a working memory that holds the LSTM's results,
    without calling the layer's own forward (which would decompose it step by step); after the probe
    the layer is the class's again. The control: a linear layer in the same spec is traced as before."""
    path = tmp_path / "lstm.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\n\nCALLS = []\n\n"
        "class CountingLSTM(nn.LSTM):\n"
        "    def forward(self, *args, **kwargs):\n"
        "        CALLS.append(args[0].device.type)\n"
        "        return super().forward(*args, **kwargs)\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lstm = CountingLSTM(64, 128, num_layers=3, batch_first=True)\n"
        "        self.fc = nn.Linear(128, 10)\n"
        "    def forward(self, x):\n"
        "        out, (h, c) = self.lstm(x)\n"
        "        return self.fc(out[:, -1, :])\n\n"
        "def get_inputs():\n    return [torch.randn(8, 256, 64)]\n"
    )
    spec = load_spec(path)
    assert [o.shape for o in spec.outputs["default"] or []] == [[8, 10]]
    sequence = 8 * 256 * 128 * 4  # the LSTM's output sequence, float32
    assert (
        spec.work_bytes["default"] >= 5 * sequence
    )  # an LSTM's 4 gates a step beside its outputs (a subclass)
    import sys

    module = next(m for name, m in sys.modules.items() if getattr(m, "__file__", None) == str(path))
    assert module.CALLS == [], module.CALLS  # the probe never ran it


def test_the_knowledge_bases_recorders_see_a_recurrent_layer_as_one_op(tmp_path: Path) -> None:
    """`knowledge.samples.signature` and `knowledge.patterns.aten_ops` record a reference's aten ops on
    meta: a recurrent layer (a subclass too) is one op to them, named after the aten op it calls, not its steps (level
    3's recurrent nets stalled a bench's start on a GPU host for minutes, recorded step by step). The
    control: the linear layer after it is recorded as its own ops."""
    from kernelevolve.knowledge.patterns import aten_ops, spec_pattern
    from kernelevolve.knowledge.samples import signature

    for layer, name in (("type('MyLSTM', (nn.LSTM,), {})(16, 32, num_layers=2, batch_first=True)", "lstm"),
                        ("nn.GRU(16, 32, num_layers=2, batch_first=True, bidirectional=True)", "gru"),
                        ("nn.RNN(16, 32, batch_first=True, nonlinearity='relu')", "rnn_relu")):  # fmt: skip
        path = tmp_path / f"{name}.py"
        path.write_text(
            "import torch\nimport torch.nn as nn\n\n"
            "class Model(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            f"        self.rnn = {layer}\n"
            "        self.fc = nn.Linear(self.rnn.hidden_size * (2 if self.rnn.bidirectional else 1), 10)\n"
            "    def forward(self, x):\n"
            "        out = self.rnn(x)[0]\n"
            "        return self.fc(out[:, -1, :])\n\n"
            "def get_inputs():\n    return [torch.randn(4, 200, 16)]\n"
        )
        spec = load_spec(path)
        ops = aten_ops(spec)
        assert ops.count(name) == 1, ops
        assert "addmm" in ops and "sigmoid" not in ops and "tanh" not in ops, ops
        assert len(ops) < 10, ops  # 200 steps x layers, decomposed, would be thousands
        assert spec_pattern(spec) == "recurrent"
        sig = signature(spec)
        assert sig is not None
        assert [op for op, _ in sig[0]].count(name) == 1 and len(sig[0]) < 10, sig[0]


@pytest.mark.parametrize(
    ("call", "work"),
    [
        ("F.smooth_l1_loss(x, y)", 64 * 1024 * 4),  # the elementwise loss, held while it is reduced
        ("F.huber_loss(x, y, reduction='sum')", 64 * 1024 * 4),
        ("F.mse_loss(x, y[:1])", 64 * 1024 * 4),  # broadcast to the larger input
        ("F.smooth_l1_loss(x, y, reduction='none')", 0),  # that tensor is the output, counted as such
    ],
)
def test_a_reducing_loss_counts_its_elementwise_tensor(tmp_path: Path, call: str, work: int) -> None:
    """One aten op on meta, an elementwise tensor as large as its inputs on a GPU: level 1's
    96_HuberLoss (T = 8 GiB) held 4 GiB more that the memory plan did not count, and ran out."""
    path = tmp_path / "loss.py"
    path.write_text(
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
        f"class Model(nn.Module):\n    def forward(self, x, y):\n        return {call}\n\n"
        "def get_inputs():\n    return [torch.rand(64, 1024), torch.rand(64, 1024)]\n"
    )
    spec = load_spec(path)
    assert spec.intermediate_bytes("default") == work
