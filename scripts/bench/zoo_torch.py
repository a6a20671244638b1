"""PyTorch side of scripts/bench/zoo.lua: one (model, task) measurement in a
process of its own, the same workload as zoo.lua's needle worker, printing
"key value" lines:

    /usr/bin/python3 scripts/bench/zoo_torch.py MODEL TASK key=value ...

    ms N        the median over `reps` timed runs (after `warmup` untimed ones)
                of one iteration, in milliseconds
    items N     what one iteration produces (images, sequences, tokens)
    rss_mb N    peak resident set of this process, MB
    threads N   torch.get_num_threads()

The models: torchvision.models.resnet50 / mobilenet_v2 / resnext50_32x4d for the CNNs; for
BERT, DistilBERT and GPT-2 (no `transformers` in Debian) the Hugging Face
module structure written in PyTorch by spec/fixtures/gen/gen_torch_zoo_bert.py
and gen_torch_zoo_gpt2.py, imported from there so that the benchmark runs the
very reference the fixtures check needle against. Random initialisation
(PyTorch's defaults): speed does not depend on trained weights.
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "spec", "fixtures", "gen"))

from bench_common import peak_rss_mb  # noqa: E402


def parse(argv):
    model, task = argv[1], argv[2]
    cfg = {}
    for kv in argv[3:]:
        k, v = kv.split("=", 1)
        if k == "device":
            cfg[k] = v
        else:
            cfg[k] = float(v) if "." in v else int(v)
    return model, task, cfg


# the device the model and its inputs live on (zoo.lua --torch-device); off
# the CPU each timed call ends with a synchronize, so its kernels are counted
DEV = torch.device("cpu")


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps, warmup, reset=None):
    """Milliseconds of one fn() call: warmup untimed calls, then the median of
    reps timed ones; reset() (untimed) runs before every call."""
    for _ in range(warmup):
        if reset:
            reset()
        fn()
    sync()
    ts = []
    for _ in range(reps):
        if reset:
            reset()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def sgd(model):
    # the same optimizer as zoo.lua's needle side
    return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train_step(model, opt, forward, labels):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(), labels)
        loss.backward()
        opt.step()
    return step


def cnn(name, task, c):
    import torchvision
    model = getattr(torchvision.models, name)().to(DEV)
    x = torch.randn(c["batch"], 3, c["size"], c["size"], device=DEV)
    if task == "infer":
        model.eval()
        def fn():
            with torch.no_grad():
                model(x)
        return fn, c["batch"]
    model.train()
    labels = torch.randint(0, 1000, (c["batch"],), device=DEV)
    return train_step(model, sgd(model), lambda: model(x), labels), c["batch"]


def bert(name, task, c):
    import gen_torch_zoo_bert as ref
    b, t = c["batch"], c["seq"]
    ids = torch.randint(0, c["vocab"], (b, t), device=DEV)
    mask = torch.ones(b, t, dtype=torch.long, device=DEV)
    labels = torch.randint(0, 2, (b,), device=DEV)
    if name == "distilbert":
        cfg = ref.Config(dict(vocab_size=c["vocab"], max_position_embeddings=512, n_layers=c["layers"],
                              n_heads=c["heads"], dim=c["hidden"], hidden_dim=c["inter"], dropout=0.1,
                              attention_dropout=0.1, activation="gelu", seq_classif_dropout=0.2,
                              pad_token_id=0, num_labels=2))
        if task == "train":
            model = ref.DistilBertForSequenceClassification(cfg)
        else:
            model = ref.DistilBertModel(cfg)
        forward = lambda: model(ids, mask)  # noqa: E731
    else:
        cfg = ref.Config(dict(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                              num_attention_heads=c["heads"], intermediate_size=c["inter"], hidden_act="gelu",
                              hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                              max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                              pad_token_id=0, num_labels=2))
        model = ref.BertForSequenceClassification(cfg) if task == "train" else ref.BertModel(cfg)
        forward = lambda: model(ids, mask)  # noqa: E731
    model.to(DEV)
    if task == "train":
        model.train()
        return train_step(model, sgd(model), forward, labels), b
    model.eval()
    def fn():
        with torch.no_grad():
            forward()
    return fn, b


def gpt2(task, c, reps, warmup):
    import gen_torch_zoo_gpt2 as ref
    cfg = dict(vocab_size=c["vocab"], n_positions=c["positions"], n_embd=c["embd"], n_layer=c["layers"],
               n_head=c["heads"], layer_norm_epsilon=1e-5)
    model = ref.GPT2LMHeadModel(cfg).to(DEV)
    model.eval()
    torch.set_grad_enabled(False)
    tr = model.transformer

    def next_id(ids, past=None):
        # the logits of the last position only, as needle's generate computes
        # them (and HF's generate, logits_to_keep = 1)
        h, past = tr(ids, past_key_values=past)
        return model.lm_head(h[:, -1, :]).argmax(-1, keepdim=True), past

    if task == "gen_kv":
        # greedy generation with the cache (HF's legacy past_key_values):
        # the prompt once, then one position per new token
        prompt = torch.randint(0, c["vocab"], (1, c["prompt"]), device=DEV)
        n = c["new"]

        def fn():
            nxt, past = next_id(prompt)
            for _ in range(n - 1):
                nxt, past = next_id(nxt, past)
        return timed(fn, reps, warmup), n
    ctx = torch.randint(0, c["vocab"], (1, c["ctx"]), device=DEV)
    if task == "step_kv":
        # the cost of one new token with ctx tokens already cached: the
        # prefill runs untimed before each timed run of `steps` decode steps
        steps = c["steps"]
        state = {}

        def reset():
            state["nxt"], state["past"] = next_id(ctx)

        def fn():
            nxt, past = state["nxt"], state["past"]
            for _ in range(steps):
                nxt, past = next_id(nxt, past)
        return timed(fn, reps, warmup, reset), steps
    # "full": a new token without a cache is a forward over the whole context
    return timed(lambda: next_id(ctx), reps, warmup), 1


def main():
    global DEV
    model, task, c = parse(sys.argv)
    DEV = torch.device(c.get("device", "cpu"))
    torch.manual_seed(0)
    torch.set_num_threads(c["threads"])
    reps, warmup = c["reps"], c["warmup"]
    # zoo.lua --bf16: each iteration under CPU autocast (bfloat16 matmul,
    # linear and conv; the backward follows the forward's dtypes)
    bf16 = c.get("bf16", 0) == 1 and DEV.type == "cpu"
    if model == "gpt2":
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            ms, items = gpt2(task, c, reps, warmup)
    else:
        if model in ("resnet50", "mobilenet_v2", "resnext50_32x4d"):
            fn, items = cnn(model, task, c)
        else:
            fn, items = bert(model, "train" if task == "train" else "infer", c)

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                fn()
        ms = timed(step, reps, warmup)
    print("ms %.6f" % ms)
    print("items %d" % items)
    print("rss_mb %.3f" % peak_rss_mb())
    print("threads %d" % torch.get_num_threads())
    print("device %s" % DEV)


if __name__ == "__main__":
    main()
