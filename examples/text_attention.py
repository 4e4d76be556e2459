"""A tiny character-level transformer trained on text shipped in the repository (the
documentation, docs/*.md, about 250,000 characters): token and position embeddings, causal
multi-head self-attention blocks (LayerNorm, MultiheadAttention, a GELU MLP, residuals),
a linear head, next-character cross-entropy, AdamW. The last tenth of the text is held out.

The held-out loss is printed at intervals beside two references: the uniform guess
(log of the alphabet's size) and the unigram entropy (the loss of a model that knows each
character's frequency and nothing else). A full run exits non-zero unless the held-out loss
ends clearly below the unigram entropy. Then it samples characters from the model (seeded).

    python examples/text_attention.py [--steps 400] [--context 32] [--width 48]
                                      [--blocks 2] [--heads 4] [--out DIR] [--quick]
"""
from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import matplotlib
import numpy as np
from threadpoolctl import threadpool_limits
from tqdm import tqdm

import easyad as ad
from easyad import nn, optim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
MARGIN = 0.5       # nats below the unigram entropy a full run's held-out loss must reach


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(LN x), then x + MLP(LN x)."""

    def __init__(self, width: int, heads: int, dtype: type) -> None:
        self.ln1 = nn.LayerNorm(width, dtype=dtype)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True, dtype=dtype)
        self.ln2 = nn.LayerNorm(width, dtype=dtype)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width, dtype=dtype), nn.GELU(),
                                 nn.Linear(4 * width, width, dtype=dtype))

    def forward(self, x, tape=None):
        h = self.ln1(x, tape)
        x = x + self.attn(h, h, h, need_weights=False, is_causal=True)[0]
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, blocks: int, heads: int,
                 dtype: type = np.float32) -> None:
        self.tokens = nn.Embedding(vocab, width, dtype=dtype)
        self.positions = nn.Embedding(context, width, dtype=dtype)
        self.blocks = [Block(width, heads, dtype) for _ in range(blocks)]
        self.ln = nn.LayerNorm(width, dtype=dtype)
        self.head = nn.Linear(width, vocab, dtype=dtype)
        for table in (self.tokens, self.positions):     # N(0, 1) rows swamp a small model
            table.weight.data[...] *= 0.1

    def __call__(self, x, tape=None):
        return self.forward(x, tape)        # integer indices stay integers (Embedding)

    def forward(self, x, tape=None):
        x = np.asarray(x)
        h = self.tokens(x, tape) + self.positions(np.arange(x.shape[-1]), tape)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln(h))                    # (N, L, vocab) logits


def load_text() -> str:
    files = sorted(DOCS.glob("*.md"))
    if not files:
        raise SystemExit(f"text_attention: no docs/*.md under {DOCS} to train on")
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def batch(ids: np.ndarray, rng: np.random.Generator, size: int, context: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """``size`` windows of ``context`` characters and each one's next characters."""
    start = rng.integers(0, len(ids) - context - 1, size)
    rows = start[:, None] + np.arange(context)
    return ids[rows], ids[rows + 1]


def loss_of(model: nn.Module, x: np.ndarray, y: np.ndarray, tape=None):
    logits = model(x, tape)
    return nn.cross_entropy(logits.reshape((-1, logits.shape[-1])), y.reshape(-1))


def sample(model: nn.Module, prompt: str, chars: list[str], n: int, context: int,
           temperature: float, rng: np.random.Generator) -> str:
    """``n`` characters after ``prompt``, each drawn from the softmax of the last logits
    (divided by ``temperature``) given the last ``context`` characters (no list: inference)."""
    index = {c: i for i, c in enumerate(chars)}
    ids = [index[c] for c in prompt]
    model.eval()
    for _ in range(n):
        logits = model(np.array([ids[-context:]])).value[0, -1] / temperature
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(chars), p=p / p.sum())))
    model.train()
    return "".join(chars[i] for i in ids)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--width", type=int, default=48)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--sample", type=int, default=200, help="characters to sample")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blas-threads", type=int, default=1,
                        help="numpy's BLAS threads (small products: one is faster on a "
                             "busy machine, see digits_cnn.py)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="folder of the figure (default: a new temporary folder)")
    parser.add_argument("--quick", action="store_true",
                        help="a few steps and a short sample (for the tests; no target)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.sample = 12, 40

    text = load_text()
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((lookup[c] for c in text), dtype=np.int64, count=len(text))
    split = int(0.9 * len(ids))
    train, held = ids[:split], ids[split:]
    counts = np.bincount(train, minlength=len(chars))
    freq = counts[counts > 0] / counts.sum()
    unigram = float(-(freq * np.log(freq)).sum())
    uniform = float(np.log(len(chars)))

    ad.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    model = CharTransformer(len(chars), args.context, args.width, args.blocks, args.heads)
    opt = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    evaluation = [batch(held, np.random.default_rng(1), 64, args.context) for _ in range(2)]

    def held_out() -> float:
        return float(np.mean([float(loss_of(model, x, y)) for x, y in evaluation]))

    print(f"{len(text):,} characters of docs/*.md ({len(chars)} distinct), "
          f"{len(held):,} held out; uniform guess {uniform:.3f} nats, unigram entropy "
          f"{unigram:.3f} nats")
    every = max(1, args.steps // 10)
    history = [(0, held_out())]
    losses = []
    started = time.perf_counter()
    with threadpool_limits(args.blas_threads):
        bar = tqdm(range(1, args.steps + 1), desc="text attention", unit="step")
        for step in bar:
            lst = ad.WengertList()
            loss = loss_of(model, *batch(train, rng, args.batch, args.context), tape=lst)
            opt.step(loss.derivatives())
            schedule.step()                    # per step: T_max is the number of steps
            losses.append(loss.number)
            if step % every == 0 or step == args.steps:
                history.append((step, held_out()))
                bar.set_postfix(train=f"{np.mean(losses[-every:]):.3f}",
                                held_out=f"{history[-1][1]:.3f}")
                tqdm.write(f"step {step:4d}: train {np.mean(losses[-every:]):.3f}, "
                           f"held out {history[-1][1]:.3f} nats")
        seconds = time.perf_counter() - started
        text_out = sample(model, "The ", chars, args.sample, args.context,
                          args.temperature, np.random.default_rng(args.seed))
    final = history[-1][1]
    print(f"{args.steps} steps in {seconds:.1f} s ({1e3 * seconds / args.steps:.0f} ms per "
          f"step); held-out loss {history[0][1]:.3f} -> {final:.3f} nats (unigram entropy "
          f"{unigram:.3f})")
    print(f"sampled at temperature {args.temperature}:\n{text_out}")

    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="easyad-text-"))
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.6, alpha=0.6, label="training batch")
    ax.plot(*zip(*history), marker="o", label="held out")
    ax.axhline(unigram, color="grey", ls="--", lw=0.8, label="unigram entropy")
    ax.set(xlabel="step", ylabel="cross-entropy (nats)", title="next-character loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "text_attention.png", dpi=110)
    plt.close(fig)
    print(f"wrote {out / 'text_attention.png'}")
    if not args.quick and final > unigram - MARGIN:
        raise SystemExit(f"text_attention: held-out loss {final:.3f} is not {MARGIN} nats "
                         f"below the unigram entropy {unigram:.3f}")
    return {"history": history, "losses": losses, "unigram": unigram, "uniform": uniform,
            "sample": text_out, "seconds": seconds}


if __name__ == "__main__":
    main()
