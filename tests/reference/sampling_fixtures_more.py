#!/usr/bin/env python3
"""Second half of the sampling fixtures (run by sampling_fixtures.py, or on its own).

Writes tests/fixtures/sampling/samplers_more.json and schedules_args.json:
- tcd, er_sde, dpm++2m_sde_bt: float64 transcriptions of stable-diffusion.cpp's
  loops (src/runtime/denoiser.hpp) on the analytic model and noise replay of
  sampling_fixtures.py. tcd is cross-checked against diffusers' TCDScheduler.
  er_sde has no k-diffusion counterpart in the pip wheel (it lives in ComfyUI's fork).
  dpm++2m_sde_bt uses upstream's own seeded Brownian tree (splitmix-style node seeds,
  libstdc++ std_default normals), NOT torchsde/k-diffusion's BrownianTreeNoiseSampler,
  so it is only compared with this transcription; the libstdc++ normals used here are
  checked bit-for-bit against a compiled C++ program.
- schedules_args.json: schedules with --extra-sample-args overrides (the upstream
  keys), computed by the schedule formulas of sampling_fixtures.py.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sampling_fixtures as base  # noqa: E402

F = np.float32
model, Replay, write, libm = base.model, base.Replay, base.write, base.libm

# ------------------------------------------------------------ libstdc++ normals


class StdDefault:
    """minstd_rand0 + libstdc++ normal_distribution<float> (Marsaglia polar, f32)."""

    def __init__(self, seed):
        s = (seed & 0xFFFFFFFF) % 2147483647
        self.state = s if s != 0 else 1

    def canonical(self):
        self.state = (self.state * 16807) % 2147483647
        v = F(F(self.state - 1) / F(2147483646.0))
        return v if v < 1 else F(np.nextafter(F(1), F(0)))

    def randn(self, n):
        out, saved = [], None
        while len(out) < n:
            if saved is not None:
                out.append(saved)
                saved = None
                continue
            while True:
                x = F(float(F(2) * self.canonical()) - 1.0)
                y = F(float(F(2) * self.canonical()) - 1.0)
                r2 = F(x * x + y * y)
                if r2 <= 1 and r2 != 0:
                    break
            mult = libm.sqrtf(F(F(-2) * F(libm.logf(r2)) / r2))
            mult = F(mult)
            saved = F(x * mult)
            out.append(F(y * mult))
        return np.array(out, dtype=F)


def check_std_default_against_cpp():
    with tempfile.TemporaryDirectory() as d:
        src, exe = os.path.join(d, "r.cpp"), os.path.join(d, "r")
        with open(src, "w") as f:
            f.write(base.STD_DEFAULT_CPP)
        subprocess.run(["g++", "-O1", "-o", exe, src], check=True)
        for seed in [0, 5, 2**40 + 99, 0xDEADBEEFCAFEF00D]:
            res = subprocess.run([exe, str(seed), "37"], check=True, capture_output=True, text=True).stdout
            want = [int(t) for t in res.split()]
            got = [int(v) for v in StdDefault(seed).randn(37).view(np.uint32)]
            assert got == want, seed
    print("std_default python transcription matches libstdc++")


# ---------------------------------------------------------------- brownian tree
M64 = (1 << 64) - 1


def mix64(v, salt):
    z = (v + salt) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class Tree:
    """Upstream BrownianTreeNoiseSampler, recursive as written there (f64 values)."""

    def __init__(self, n, tmin, tmax, seed):
        self.n, self.tmin, self.tmax = n, tmin, tmax
        self.root = mix64(seed, 0x9E3779B97F4A7C15)
        z = StdDefault(mix64(seed, 0xBF58476D1CE4E5B9)).randn(n).astype(np.float64)
        self.wmax = z * math.sqrt(tmax - tmin)

    def bridge(self, a, c, wa, wc, t, seed, depth):
        if depth <= 0 or c - a < 1e-9:
            al = (t - a) / (c - a) if c > a else 0.5
            return (1 - al) * wa + al * wc
        m = 0.5 * (a + c)
        sd = math.sqrt((c - m) * (m - a) / (c - a))
        wm = 0.5 * (wa + wc) + sd * StdDefault(seed).randn(self.n).astype(np.float64)
        if t == m:
            return wm
        if t < m:
            return self.bridge(a, m, wa, wm, t, mix64(seed, 1), depth - 1)
        return self.bridge(m, c, wm, wc, t, mix64(seed, 2), depth - 1)

    def w(self, t):
        return self.bridge(self.tmin, self.tmax, np.zeros(self.n), self.wmax, t, self.root, 24)

    def __call__(self, sa, sb):
        cl = lambda t: min(max(t, self.tmin), self.tmax)
        a, b = cl(min(sa, sb)), cl(max(sa, sb))
        return (self.w(b) - self.w(a)) / math.sqrt(max(abs(sb - sa), 1e-12))


def s_2m_sde_bt(x, sig, rng, eta, flow, ex):
    pos = [float(F(s)) for s in sig if s > 0]
    tmin, tmax = min(pos), max(pos)
    if tmax <= tmin:
        return x
    draw = F(rng.randn(2)).view(np.uint32)
    tree = Tree(len(x), tmin, tmax, int(draw[0]) | (int(draw[1]) << 32))
    old, hl = None, 0.0
    for i in range(len(sig) - 1):
        den = model(x, sig[i])
        if sig[i + 1] == 0:
            x = den
        else:
            h = -math.log(sig[i + 1]) + math.log(sig[i])
            eh = eta * h
            b = -math.expm1(-h - eh)
            x = sig[i + 1] / sig[i] * math.exp(-eh) * x + b * den
            if old is not None:
                x = x + 0.5 * b / (hl / h) * (den - old)
            if eta > 0:
                x = x + tree(float(F(sig[i])), float(F(sig[i + 1]))) * sig[i + 1] * math.sqrt(-math.expm1(-2 * eh))
            hl = h
        old = den
    return x


# -------------------------------------------------------------------------- tcd


def tcd_alphas_cumprod():
    # upstream: f32 sqrt-beta ramp, squared and accumulated in f64.
    bs, be = F(math.sqrt(F(0.00085))), F(math.sqrt(F(0.012)))
    ac, prev = [], 1.0
    for i in range(1000):
        r = F(bs + F(F(be - bs) * F(F(i) / F(999))))
        prev = prev * (1.0 - float(r) ** 2)
        ac.append(prev)
    return np.array(ac)


TCD_AC = tcd_alphas_cumprod()
TCD_SIG = np.sqrt((1 - TCD_AC) / TCD_AC)


def tcd_timestep(s):
    hi = int(np.searchsorted(TCD_SIG, s, side="left"))
    if hi == 0:
        return 0
    if hi == 1000:
        return 999
    return hi if abs(TCD_SIG[hi] - s) < abs(TCD_SIG[hi - 1] - s) else hi - 1


def s_tcd(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        s, st = sig[i], sig[i + 1]
        prev_t = tcd_timestep(float(F(st)))
        ts = max(int(math.floor(F(F(1 - F(eta)) * F(prev_t)))), 0)
        den = model(x, s)
        d = (x - den) / s
        a_prev = 1 / (st * st + 1)
        a_s = TCD_AC[ts]
        x = math.sqrt(a_s / a_prev) * den + math.sqrt((1 - a_s) / a_prev) * d
        if eta > 0 and st > 0:
            # upstream's f32 `1/alpha_prev - 1/alpha_s` cancels badly near sigma_min, so
            # this one coefficient is taken in f32 like there.
            a_prev32, a_s32 = F(F(1) / F(F(F(st) * F(st)) + F(1))), F(a_s)
            k1 = math.sqrt(max(float(F(F(F(1) / a_prev32) - F(F(1) / a_s32))), 0.0))
            if ex.get("f64"):  # exact coefficient, for the diffusers cross-check
                k1 = math.sqrt(1 / a_prev - 1 / a_s)
            x = math.sqrt(a_prev / a_s) * x + k1 * rng.randn(len(x))
    return x


def tcd_crosscheck(x0):
    """diffusers TCDScheduler (eps prediction) on table sigmas, all but the final step."""
    # sampling_fixtures' k-diffusion cross-check leaves spec-less stub modules
    # (torchsde, scipy, ...) in sys.modules, which diffusers' import probing rejects.
    stubs = {k: m for k, m in sys.modules.items() if getattr(m, "__spec__", 0) is None
             and k.split(".")[0] in ("scipy", "torchdiffeq", "torchsde", "tqdm")}
    for k in stubs:
        del sys.modules[k]
    try:
        from diffusers import TCDScheduler
        import diffusers.schedulers.scheduling_tcd as mod
    finally:
        sys.modules.update(stubs)
    ts = [999, 759, 499, 259, 99, 19]
    sig = [float(TCD_SIG[t]) for t in ts]
    for eta in [0.0, 0.3, 1.0]:
        sch = TCDScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
        sch.alphas_cumprod = torch.tensor(TCD_AC)
        sch.timesteps = torch.tensor(ts)
        sch.num_inference_steps = len(ts)
        sch._step_index = 0
        rng = Replay(5, 0)
        mod.randn_tensor = lambda shape, **kw: torch.from_numpy(rng.randn(int(np.prod(shape))))
        x = torch.tensor(x0 / math.sqrt(1 + sig[0] ** 2))
        for k, t in enumerate(ts[:-1]):
            xk = x.numpy() * math.sqrt(1 + sig[k] ** 2)
            eps = torch.tensor((xk - model(xk, sig[k])) / sig[k])
            x = sch.step(eps, t, x, eta=eta).prev_sample
        ref = x.numpy() * math.sqrt(1 + sig[-1] ** 2)
        ours = s_tcd(x0.copy(), sig, Replay(5, 0), eta, False, {"f64": True})
        err = np.abs(ref - ours).max()
        assert err < 1e-10, (eta, err)
    print("tcd transcription matches diffusers TCDScheduler")


# ----------------------------------------------------------------------- er_sde


def s_er_sde(x, sig, rng, eta, flow, ex):
    sig = list(sig)
    fs = lambda s: min(max(s, 1e-6), 1 - 1e-4)
    if flow:
        sig = [fs(s) if (s > 1 and i + 1 < len(sig)) else s for i, s in enumerate(sig)]
    lam = [fs(s) / max(1 - fs(s), 1e-6) if flow else max(s, 1e-6) for s in sig]
    alpha = lambda s: 1 - fs(s) if flow else 1.0
    scaler = lambda v: max(v, 0.0) * (math.exp(max(v, 0.0) ** 0.3) + 10)
    old = old_d = None
    for i in range(len(sig) - 1):
        den = model(x, sig[i])
        stage = min(3, i + 1)
        if sig[i + 1] == 0:
            x = den
        else:
            ls, lt = lam[i], lam[i + 1]
            a_s, a_t = alpha(sig[i]), alpha(sig[i + 1])
            sc_s, sc_t = scaler(ls), scaler(lt)
            r_a = a_t / a_s if a_s > 0 else 0.0
            r = sc_t / sc_s if sc_s > 0 else 0.0
            x = r_a * r * x + a_t * (1 - r) * den
            if stage >= 2 and old is not None:
                dt = lt - ls
                step = -dt / 200
                s = su = 0.0
                for p in range(200):
                    lp = lt + p * step
                    sp = scaler(lp)
                    if sp <= 0:
                        continue
                    s += 1 / sp
                    if stage >= 3 and old_d is not None:
                        su += (lp - ls) / sp
                s *= step
                dd_den = ls - lam[i - 1]
                if abs(dd_den) > 1e-12:
                    dd = (den - old) / dd_den
                    x = x + a_t * (dt + s * sc_t) * dd
                    if stage >= 3 and old_d is not None:
                        du_den = (ls - lam[i - 2]) * 0.5
                        if abs(du_den) > 1e-12:
                            su *= step
                            x = x + a_t * (0.5 * dt * dt + su * sc_t) * ((dd - old_d) / du_den)
                    old_d = dd
            nsq = lt * lt - ls * ls * r * r
            if eta > 0 and nsq > 0:
                x = x + rng.randn(len(x)) * a_t * math.sqrt(nsq)
        old = den
    return x


# --------------------------------------------------------------------- fixtures


def main_samplers_more():
    check_std_default_against_cpp()
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(16, generator=gen, dtype=torch.float64).numpy().astype(F).astype(np.float64)
    tcd_crosscheck(x0 * base.K_SIGMAS[0])
    runs = {
        "tcd": (s_tcd, [0.0, 0.3, 0.5, 1.0], [0.3]),
        "er_sde": (s_er_sde, [1.0, 0.5, 0.0], [1.0, 0.0]),
        "dpm++2m_sde_bt": (s_2m_sde_bt, [1.0, 0.5, 0.0], [1.0]),
    }
    cases = []
    for name, (fn, k_etas, flow_etas) in runs.items():
        for flow, sig, etas in [(False, base.K_SIGMAS, k_etas), (True, base.FLOW_SIGMAS, flow_etas)]:
            x = x0 * (1.0 if flow else sig[0])
            for eta in etas:
                out = fn(x.copy(), sig, Replay(11, 0), eta, flow, {})
                cases.append(dict(sampler=name, flow=flow, eta=eta, sigmas=sig,
                                  x=[float(v) for v in x], out=[float(v) for v in out]))
    # flow er_sde with sigmas above 1 (clamped to 1 - 1e-4 upstream)
    sig = [1.3] + base.FLOW_SIGMAS[1:]
    cases.append(dict(sampler="er_sde", flow=True, eta=1.0, sigmas=sig, x=[float(v) for v in x0],
                      out=[float(v) for v in s_er_sde(x0.copy(), sig, Replay(11, 0), 1.0, True, {})]))
    # bt: single step (upstream returns the input untouched) and a longer schedule
    for sig in [[14.6146, 0.0], [14.6146, 10.0, 7.0, 5.0, 3.1, 2.0, 1.2, 0.8, 0.5, 0.3, 0.15, 0.08, 0.0292, 0.0]]:
        x = x0 * sig[0]
        out = s_2m_sde_bt(x.copy(), sig, Replay(11, 0), 1.0, False, {})
        cases.append(dict(sampler="dpm++2m_sde_bt", flow=False, eta=1.0, sigmas=sig,
                          x=[float(v) for v in x], out=[float(v) for v in out]))
    write("samplers_more.json", {"noise_seed": 11, "cases": cases})


def ltx2_args(n, seq, mx=2.05, base_=0.95, terminal=0.1, stretch=True):
    if stretch:
        return base.ltx2(n, seq, mx=mx, base=base_, terminal=min(max(terminal, 0.0), 0.99))
    m = (mx - base_) / (4096 - 1024)
    es = math.exp(seq * m + base_ - m * 1024)
    v = [es / (es + (1 / s - 1)) if s != 0 else 0.0 for s in (1 - i / n for i in range(n + 1))]
    v[n] = 0.0
    return v


def main_schedule_args():
    disc = base.t_to_sigma_discrete
    cases = []

    def add(name, n, args, sig, seq=0, model="sd"):
        cases.append(dict(schedule=name, model=model, steps=n, image_seq_len=seq,
                          args=[[k, v] for k, v in args], sigmas=[float(v) for v in sig]))

    for n in [1, 4, 10, 20]:
        add("beta", n, [("alpha", "0.5"), ("beta", "0.7")], base.beta_sched(n, disc, a=0.5, b=0.7))
        add("beta", n, [("beta", "2")], base.beta_sched(n, disc, a=0.6, b=2.0))
        add("flux", n, [("base_shift", "0.3"), ("max_shift", "1.5")],
            base.flux(n, 4096, base=0.3, mx=1.5), seq=4096, model="none")
        add("flux", n, [("max_shift", "0.9")], base.flux(n, 2048, mx=0.9), seq=2048, model="none")
        add("ltx2", n, [("max_shift", "2.5"), ("base_shift", "1.0"), ("terminal", "0.05")],
            ltx2_args(n, 6144, mx=2.5, base_=1.0, terminal=0.05), seq=6144, model="none")
        add("ltx2", n, [("stretch", "false")], ltx2_args(n, 6144, stretch=False), seq=6144, model="none")
        add("ltx2", n, [("terminal", "1.5")], ltx2_args(n, 2048, terminal=1.5), seq=2048, model="none")
        add("logit_normal", n, [("mu", "0.4"), ("std", "1.2")],
            base.logit_normal(n, 4096, mean=0.4, std=1.2), seq=4096, model="none")
        add("logit_normal", n, [("logsnr_min", "-10"), ("logsnr_max", "12"), ("resolution_aware", "off")],
            base.logit_normal(n, 0, lo=-10.0, hi=12.0), seq=4096, model="none")
    write("schedules_args.json", cases)


def main():
    main_samplers_more()
    main_schedule_args()


if __name__ == "__main__":
    main()
