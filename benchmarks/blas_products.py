"""The deep networks' matrix products through torch's BLAS and through numpy's, at one thread.

    python benchmarks/blas_products.py [--repetitions 40] [--quick] [--out benchmarks/results/blas_products.json]

Where a deep workload of benchmarks/engine_throughput.py spends its time: a local step of the BitRand MLP
(384 → 1500 → 1500 → 4, batches of 64: the FedAvg campaign's) is almost all matrix products, and the
engine, the plain per-client loop and pfl-research all call the same ones through torch. Which BLAS
library computes them therefore decides how fast any of the three can be (performance goal 7). This
times each product of the step (forward, gradient of the input, gradient of the weight) through torch
(`torch.mm`, the BLAS torch was built with: MKL in the x86 wheels) and through numpy (`@` on the same
memory, the BLAS numpy ships with: OpenBLAS in its wheels), then the whole step (forward, backward,
SGD update) both ways: torch's autograd, and the same autograd with each linear layer's products
computed by numpy (NumpyLinear). Rounds alternate between the two; the fastest of each is printed.
The two steps' gradients agree to float32 rounding (checked before timing; the order of the sums
differs, so the last bits do). Not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # before numpy and torch load their BLAS: one thread each (not when a test loads it)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling result_file.py, however this file is loaded
from result_file import write_result_file  # noqa: E402

# (label, layer widths, batch): the BitRand MLP's local step and LeNet-5's classifier on a client's 600 images.
NETWORKS = (("bitrand-mlp", (384, 1500, 1500, 4), 64), ("lenet5-classifier", (400, 120, 84, 10), 600))
QUICK_NETWORKS = (("bitrand-mlp", (384, 300, 300, 4), 64),)


class NumpyLinear(torch.autograd.Function):
    """x·Wᵀ + b with both products of its backward computed by numpy's BLAS on the tensors' memory."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight)
        return torch.from_numpy(inputs.detach().numpy() @ weight.detach().numpy().T).add_(bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        inputs, weight = ctx.saved_tensors
        g = grad.contiguous().numpy()
        grad_inputs = torch.from_numpy(g @ weight.detach().numpy()) if ctx.needs_input_grad[0] else None
        return grad_inputs, torch.from_numpy(g.T @ inputs.detach().numpy()), grad.sum(0)


def blas_libraries() -> dict[str, str]:
    """The BLAS each library calls: torch's build flag, numpy's from its configuration."""
    torch_blas = next((part.split("=", 1)[1] for part in torch.__config__.show().replace(",", " ").split()
                       if part.startswith("BLAS_INFO=")), "unknown")
    try:
        numpy_blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]
    except (TypeError, KeyError):
        numpy_blas = "unknown"
    return {"torch": torch_blas, "numpy": numpy_blas}


def fastest(function, repetitions: int) -> float:
    function()
    best = float("inf")
    for _ in range(repetitions):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def alternating(functions: dict, repetitions: int, rounds: int = 3) -> dict[str, float]:
    """Each function's fastest time, over `rounds` rounds that take them in turn (drift hits both)."""
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(rounds):
        for name, function in functions.items():
            best[name] = min(best[name], fastest(function, repetitions))
    return best


def products(widths: tuple[int, ...], batch: int) -> list[tuple[str, tuple, bool, tuple, bool]]:
    """Every product of one step, with its operands laid out as autograd has them: per layer, forward
    x·Wᵀ, the input's gradient g·W (not the first layer's), the weight's gradient gᵀ·x; each as (name,
    shape of the left operand, whether it is a transposed view, the same of the right)."""
    found = []
    for layer, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        found.append((f"layer {layer + 1} forward", (batch, fan_in), False, (fan_in, fan_out), True))
        if layer:
            found.append((f"layer {layer + 1} input gradient", (batch, fan_out), False, (fan_out, fan_in), False))
        found.append((f"layer {layer + 1} weight gradient", (fan_out, batch), True, (batch, fan_in), False))
    return found


def operand(shape: tuple[int, int], transposed: bool, generator: torch.Generator) -> torch.Tensor:
    """A random matrix of `shape`, as a transposed view of its transpose where `transposed`."""
    if transposed:
        return torch.randn(*shape[::-1], generator=generator).t()
    return torch.randn(*shape, generator=generator)


def product_times(a: torch.Tensor, b: torch.Tensor, repetitions: int) -> dict[str, float]:
    an, bn = a.numpy(), b.numpy()  # the same memory, strides included
    return alternating({"torch": lambda: torch.mm(a, b), "numpy": lambda: an @ bn}, repetitions)


def step_functions(widths: tuple[int, ...], batch: int, generator: torch.Generator) -> tuple[dict, float]:
    """The local SGD step through torch and through NumpyLinear, and how far apart their gradients are."""
    layers = [torch.nn.Linear(fan_in, fan_out) for fan_in, fan_out in zip(widths, widths[1:])]
    parameters = [p for layer in layers for p in layer.parameters()]
    inputs = torch.randn(batch, widths[0], generator=generator)
    targets = torch.randint(0, widths[-1], (batch,), generator=generator)

    def gradients(numpy_products: bool) -> tuple[torch.Tensor, ...]:
        hidden = inputs
        for index, layer in enumerate(layers):
            hidden = (NumpyLinear.apply(hidden, layer.weight, layer.bias) if numpy_products
                      else F.linear(hidden, layer.weight, layer.bias))
            if index < len(layers) - 1:
                hidden = torch.relu(hidden)
        return torch.autograd.grad(F.cross_entropy(hidden, targets, reduction="sum"), parameters)

    difference = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                     for a, b in zip(gradients(True), gradients(False)))

    def step(numpy_products: bool):
        def run():
            grads = gradients(numpy_products)
            with torch.no_grad():
                torch._foreach_add_(parameters, grads, alpha=-0.3 / batch)  # as gradients: per-client steps
        return run

    return {"torch": step(False), "numpy": step(True)}, difference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="a small MLP and few repetitions (smoke test)")
    parser.add_argument("--out", default="benchmarks/results/blas_products.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    repetitions = 3 if args.quick else args.repetitions
    generator = torch.Generator().manual_seed(0)
    libraries = blas_libraries()
    print(f"BLAS: torch {libraries['torch']}, numpy {libraries['numpy']}; one thread each")
    print(f"{'network':18s} {'product':26s} {'shape':>18s} {'torch ms':>9s} {'numpy ms':>9s} {'torch/numpy':>11s}")
    results = []
    for network, widths, batch in QUICK_NETWORKS if args.quick else NETWORKS:
        for name, left, left_transposed, right, right_transposed in products(widths, batch):
            best = product_times(operand(left, left_transposed, generator), operand(right, right_transposed, generator),
                                 repetitions)
            shape = f"{left[0]}×{left[1]}×{right[1]}"
            results.append({"network": network, "what": name, "shape": shape, "torch_seconds": best["torch"],
                            "numpy_seconds": best["numpy"], "ratio": best["torch"] / best["numpy"]})
            print(f"{network:18s} {name:26s} {shape:>18s} {1e3 * best['torch']:9.3f} {1e3 * best['numpy']:9.3f} "
                  f"{best['torch'] / best['numpy']:11.2f}", flush=True)
        functions, difference = step_functions(widths, batch, generator)
        best = alternating(functions, repetitions)
        results.append({"network": network, "what": "local SGD step", "shape": f"batch {batch}",
                        "torch_seconds": best["torch"], "numpy_seconds": best["numpy"],
                        "ratio": best["torch"] / best["numpy"], "gradient_relative_difference": difference})
        print(f"{network:18s} {'local SGD step (autograd)':26s} {f'batch {batch}':>18s} {1e3 * best['torch']:9.3f} "
              f"{1e3 * best['numpy']:9.3f} {best['torch'] / best['numpy']:11.2f}   (gradients apart by "
              f"{difference:.1e} of their largest)", flush=True)
    write_result_file("blas_products", results, args.out, quick=args.quick, blas=libraries, threads=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
