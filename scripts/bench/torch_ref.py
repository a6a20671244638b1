"""PyTorch side of scripts/bench/run.lua: the workloads of
scripts/bench/workloads.lua (issue 7), same names, shapes, optimizers,
per-call counts and timing method (bench_common.per_iter: WARMUP untimed
calls, then the median of REPS timed runs). Runs one workload per process, so
that its peak RSS is its own, and prints "key value" lines:

    torch_ref.py NAME REPS WARMUP THREADS [DEVICE]
    torch_ref.py --list          the workload names, one a line

    ms N        median time of one call (for a workload with steps: the
                median step of all its steps)
    rss_mb N    peak resident set (VmHWM) of this process at the end, MB
    threads N   torch.get_num_threads()

Word ids and labels are 0-based here (1-based on the needle side). Training
steps are zero_grad(set_to_none=True), forward, cross-entropy, backward, step,
as needle's optimizers set grads to nil.

DEVICE (default cpu, e.g. cuda) holds the model and inputs; each timed call
ends with torch.cuda.synchronize() there, and TF32 is off (float32 as needle
computes it)."""
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from bench_common import peak_rss_mb, per_iter  # noqa: E402

# needle's ResNet9 module tree, as the converter's fixtures build it
GEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "spec", "fixtures", "gen")
sys.path.insert(0, GEN)
from gen_torch_resnet9 import ResNet9  # noqa: E402

DEV = torch.device("cpu")  # main() sets it from the command line


class RNNModel(nn.Module):
    """PyTorch's examples/word_language_model (LSTM, no dropout, untied), the
    same as needle's nn.LanguageModel."""

    def __init__(self, ntoken, ninp, nhid, nlayers):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.ntoken = ntoken

    def forward(self, ids, state=None):
        out, state = self.rnn(self.encoder(ids), state)
        return self.decoder(out).view(-1, self.ntoken), state


def lstm_step():
    V, T, B = 10000, 35, 20
    model = RNNModel(V, 128, 256, 2).to(DEV)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids = torch.randint(0, V, (T, B)).to(DEV)
    y = torch.randint(0, V, (T * B,)).to(DEV)
    box = [None]

    def step():
        opt.zero_grad(set_to_none=True)
        state = box[0]
        if state is not None:  # truncated backpropagation through time
            state = tuple(s.detach() for s in state)
        logits, box[0] = model(ids, state)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        opt.step()
    return step


def train_step(model, opt, x, y):
    x, y = x.to(DEV), y.to(DEV)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return step


def infer(model, x):
    model.to(DEV).eval()
    x = x.to(DEV)

    def call():
        with torch.no_grad():
            return model(x)
    return call


def matmul(m, k, n):
    a, b = torch.rand(m, k).to(DEV), torch.rand(k, n).to(DEV)
    return lambda: a @ b


def small_ops(grad):
    x, y = torch.rand(16).to(DEV).requires_grad_(grad), torch.rand(16).to(DEV)

    def call():
        for _ in range(1000):
            x + y
    return call


def mlp_train():
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return train_step(model, opt, torch.randn(128, 784), torch.randint(0, 10, (128,)))


def resnet9_train():
    model = ResNet9().to(DEV)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return train_step(model, opt, torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,)))


def transformer_infer():
    layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
    return infer(nn.TransformerEncoder(layer, 4), torch.randn(8, 128, 256))


def mlp5_infer():
    mods = []
    for _ in range(5):
        mods += [nn.Linear(512, 512), nn.ReLU()]
    return infer(nn.Sequential(*mods), torch.randn(8, 512))


# name -> (setup, inner calls per timed run, steps); the same as workloads.lua
WORKLOADS = {
    "matmul_1024": (lambda: matmul(1024, 1024, 1024), 1, None),
    "matmul_bert": (lambda: matmul(128, 3072, 768), 1, None),
    "small_ops": (lambda: small_ops(False), 1, None),
    "small_ops_grad": (lambda: small_ops(True), 1, None),
    "mlp_train": (mlp_train, 1, None),
    "lstm_train": (lstm_step, 1, None),
    "resnet9_train": (resnet9_train, 1, None),
    "transformer_infer": (transformer_infer, 1, None),
    "mlp5_infer": (mlp5_infer, 20, None),
    "resnet9_infer": (lambda: infer(ResNet9(), torch.randn(8, 3, 32, 32)), 5, None),
    "lstm_rss": (lstm_step, 1, 200),
    # needle's compiled variants (issue 17) against the same eager PyTorch code
    "small_ops_compiled": (lambda: small_ops(False), 1, None),
    "mlp_train_compiled": (mlp_train, 1, None),
    "lstm_train_compiled": (lstm_step, 1, None),
    "resnet9_train_compiled": (resnet9_train, 1, None),
    "transformer_infer_compiled": (transformer_infer, 1, None),
    "mlp5_infer_compiled": (mlp5_infer, 20, None),
    "resnet9_infer_compiled": (lambda: infer(ResNet9(), torch.randn(8, 3, 32, 32)), 5, None),
}


def main():
    if sys.argv[1:] == ["--list"]:
        print("\n".join(WORKLOADS))
        return
    global DEV
    if len(sys.argv) not in (5, 6) or sys.argv[1] not in WORKLOADS:
        sys.exit("usage: torch_ref.py NAME REPS WARMUP THREADS [DEVICE] (NAME: %s)" % ", ".join(WORKLOADS))
    name, reps, warmup, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    DEV = torch.device(sys.argv[5] if len(sys.argv) == 6 else "cpu")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    setup, inner, steps = WORKLOADS[name]
    fn = setup()
    if DEV.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        call = fn

        def fn():
            call()
            torch.cuda.synchronize()
    if steps:
        ts = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        ms = ts[(len(ts) - 1) // 2] * 1e3
    else:
        ms = per_iter(fn, inner, reps, warmup * inner) * 1e3
    print("ms %.6f" % ms)
    print("rss_mb %.3f" % peak_rss_mb())
    print("threads %d" % torch.get_num_threads())


if __name__ == "__main__":
    main()
