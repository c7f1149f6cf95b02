#!/usr/bin/env python3
"""Writes tests/fixtures/sampling/*.json, the references for tests/sampling.rs.

Re-runnable: `python3 tests/reference/sampling_fixtures.py` (needs torch, numpy; g++ for
the std_default reference; k-diffusion wheel optional, used to cross-check the sampler
transcriptions below when installed with `pip install --no-deps k-diffusion`).

References:
- rng cpu: torch.manual_seed + torch.randn itself (stored as f32 bit patterns).
- rng cuda: the webui Philox algorithm transcribed in numpy; the final Box-Muller step in
  f32 like stable-diffusion.cpp, calling the C library's logf/sinf through ctypes.
- rng std_default: a small C++ program (ours) printing std::default_random_engine +
  std::normal_distribution<float> output from the host libstdc++.
- schedules: k-diffusion / diffusers formulas or a direct float64 transcription of the
  upstream formula (see each function).
- samplers: float64 torch transcriptions of the sampler loops (k-diffusion's where the
  upstream sampler is k-diffusion's), run on an analytic denoiser with recorded noise.
- tcd, er_sde, dpm++2m_sde_bt and schedules with --extra-sample-args: see
  sampling_fixtures_more.py (called at the end).
"""
import ctypes
import ctypes.util
import json
import math
import os
import subprocess
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "sampling")

libm = ctypes.CDLL(ctypes.util.find_library("m"))
for fn in ("logf", "sinf", "cosf", "sqrtf"):
    getattr(libm, fn).restype = ctypes.c_float
    getattr(libm, fn).argtypes = [ctypes.c_float]


def f32_bits(a):
    return [int(v) for v in np.asarray(a, dtype=np.float32).view(np.uint32)]


def write(name, obj):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


# ----------------------------------------------------------------------------- rng

def rng_cpu_cases():
    cases = []
    for seed in [0, 1, 42, 12345, 2**32 + 7, 987654321]:
        for sizes in [[1], [3], [15], [16], [17], [31], [32], [100], [1000], [5, 20, 3, 40]]:
            torch.manual_seed(seed)
            outs = [f32_bits(torch.randn(n).numpy()) for n in sizes]
            cases.append({"seed": seed, "sizes": sizes, "bits": outs})
    return cases


def philox_words(seed, offset, n):
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    w0, w1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
    c = np.zeros((4, n), dtype=np.uint32)
    c[0] = offset
    c[2] = np.arange(n, dtype=np.uint32)
    k0 = np.full(n, seed & 0xFFFFFFFF, dtype=np.uint32)
    k1 = np.full(n, seed >> 32, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for r in range(10):
            if r > 0:
                k0 = k0 + w0
                k1 = k1 + w1
            v1 = c[0].astype(np.uint64) * m0
            v2 = c[2].astype(np.uint64) * m1
            c = np.stack([
                (v2 >> np.uint64(32)).astype(np.uint32) ^ c[1] ^ k0,
                v2.astype(np.uint32),
                (v1 >> np.uint64(32)).astype(np.uint32) ^ c[3] ^ k1,
                v1.astype(np.uint32),
            ])
    return c[0], c[1]


def philox_sdcpp(seed, offset, n):
    """stable-diffusion.cpp's f32 Box-Muller (words rounded to f32 first)."""
    a, b = philox_words(seed, offset, n)
    inv = np.float32(2.3283064e-10)
    inv2pi = np.float32(inv * np.float32(6.2831855))
    out = []
    for x, y in zip(a.astype(np.float32), b.astype(np.float32)):
        u = np.float32(np.float32(x * inv) + np.float32(inv / np.float32(2)))
        v = np.float32(np.float32(y * inv2pi) + np.float32(inv2pi / np.float32(2)))
        s = libm.sqrtf(float(np.float32(-2.0) * np.float32(libm.logf(float(u)))))
        out.append(np.float32(np.float32(s) * np.float32(libm.sinf(float(v)))))
    return np.array(out, dtype=np.float32)


def philox_webui(seed, offset, n):
    """The webui's published transform (f64 arithmetic, rounded at the end)."""
    a, b = philox_words(seed, offset, n)
    inv = np.array([2.3283064e-10], dtype=np.float32)
    inv2pi = np.array([2.3283064e-10 * 6.2831855], dtype=np.float32)
    u = a * inv + inv / 2
    v = b * inv2pi + inv2pi / 2
    return (np.sqrt(-2.0 * np.log(u)) * np.sin(v)).astype(np.float32)


def rng_cuda_cases():
    cases = []
    for seed in [0, 1, 42, 12345, 2**32 + 7, 987654321]:
        sizes = [1, 7, 16, 33, 300]
        outs, webui = [], []
        for off, n in enumerate(sizes):
            outs.append(f32_bits(philox_sdcpp(seed, off, n)))
            webui.append(f32_bits(philox_webui(seed, off, n)))
        cases.append({"seed": seed, "sizes": sizes, "bits": outs, "webui_bits": webui})
    return cases


STD_DEFAULT_CPP = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
int main(int argc, char** argv) {
    unsigned long long seed = std::strtoull(argv[1], nullptr, 10);
    std::default_random_engine gen;
    gen.seed((unsigned int)seed);
    for (int a = 2; a < argc; a++) {
        int n = std::atoi(argv[a]);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        for (int i = 0; i < n; i++) {
            float v = dist(gen);
            unsigned int bits;
            std::memcpy(&bits, &v, 4);
            std::printf("%u ", bits);
        }
        std::printf("\n");
    }
    return 0;
}
"""


def rng_std_default_cases():
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "r.cpp")
        exe = os.path.join(d, "r")
        with open(src, "w") as f:
            f.write(STD_DEFAULT_CPP)
        subprocess.run(["g++", "-O1", "-o", exe, src], check=True)
        cases = []
        for seed in [0, 1, 42, 12345, 2**32 + 7, 987654321]:
            sizes = [1, 5, 16, 101]
            res = subprocess.run([exe, str(seed)] + [str(n) for n in sizes],
                                 check=True, capture_output=True, text=True).stdout
            outs = [[int(t) for t in line.split()] for line in res.strip().split("\n")]
            cases.append({"seed": seed, "sizes": sizes, "bits": outs})
        return cases


def main_rng():
    write("rng.json", {
        "cpu": rng_cpu_cases(),
        "cuda": rng_cuda_cases(),
        "std_default": rng_std_default_cases(),
    })



# ----------------------------------------------------------------------- schedules
# The discrete table is built in f32 exactly as upstream (calculate_alphas_cumprod),
# everything after it in f64 (so differences measure our f32 arithmetic only).

F = np.float32


def sd_table():
    ls, le = np.sqrt(F(0.00085)), np.sqrt(F(0.012))
    amount = F(le - ls)
    prod = F(1.0)
    ac = []
    for i in range(1000):
        beta = F(ls + F(amount * F(F(i) / F(999))))
        prod = F(prod * F(F(1.0) - F(beta * beta)))
        ac.append(prod)
    ac = np.array(ac, dtype=F)
    sig = np.sqrt((F(1) - ac) / ac).astype(F)
    return sig


SIG = sd_table()
LOG_SIG = np.log(SIG.astype(np.float64))


def t_to_sigma_discrete(t):
    lo, hi = math.floor(t), math.ceil(t)
    w = t - lo
    return math.exp((1 - w) * LOG_SIG[lo] + w * LOG_SIG[hi])


def t_to_sigma_flow(shift):
    def f(t):
        t = (t + 1) / 1000.0
        return shift * t / (1 + (shift - 1) * t)
    return f


def k_discrete(n, t2s):  # k-diffusion DiscreteSchedule.get_sigmas
    if n == 1:
        return [t2s(999.0), 0.0]
    ts = np.linspace(999, 0, n)
    return [t2s(float(t)) for t in ts] + [0.0]


def k_karras(n, smin, smax, rho=7.0):  # k-diffusion get_sigmas_karras
    smin = max(smin, 1e-6)
    ramp = np.linspace(0, 1, n)
    mi, ma = smin ** (1 / rho), smax ** (1 / rho)
    return list((ma + ramp * (mi - ma)) ** rho) + [0.0]


def k_exponential(n, smin, smax):  # k-diffusion get_sigmas_exponential
    return list(np.exp(np.linspace(math.log(smax), math.log(smin), n))) + [0.0]


def linear_space_f32(start, end, num):
    # upstream linear_space: repeated f32 addition of the increment
    inc = F(F(F(end) - F(start)) / F(num - 1))
    v = [F(start)]
    for _ in range(1, num):
        v.append(F(v[-1] + inc))
    return v


def sgm_uniform(n, t2s):  # timesteps from upstream's f32 linear_space
    ts = linear_space_f32(999, 0, n + 1)[:n]
    return [t2s(float(t)) for t in ts] + [0.0]


def simple(n, t2s):  # ComfyUI simple_scheduler, with upstream's f32 step factor
    ss = F(F(1000) / F(n))
    return [t2s(float(999 - int(F(F(i) * ss)))) for i in range(n)] + [0.0]


def smoothstep(n, t2s):
    if n == 1:
        return [t2s(999.0), 0.0]
    out = []
    for i in range(n):
        u = 1 - i / n
        out.append(t2s(float(round(u * u * (3 - 2 * u) * 999))))
    return out + [0.0]


def kl_optimal(n, smin, smax):  # ComfyUI kl_optimal_scheduler
    if n == 1:
        return [smax, 0.0]
    amin, amax = math.atan(max(smin, 1e-6)), math.atan(smax)
    return [math.tan(t * amin + (1 - t) * amax) for t in np.linspace(0, 1, n)] + [0.0]


def lcm(n, t2s):
    return [t2s(float((50 - (i * 50) // n) * 20 - 1)) for i in range(n)] + [0.0]


def ays_interp(table, n):  # log-linear resampling (AYS "howto" loglinear_interp)
    xs = np.linspace(0, 1, len(table))
    ys = np.log(np.array(table[::-1], dtype=np.float64))
    new = np.exp(np.interp(np.linspace(0, 1, n), xs, ys))[::-1]
    return list(new)


AYS_SD1 = [14.6146412293, 6.4745760956, 3.8636745985, 2.6946151520, 1.8841921177, 1.3943805092,
           0.9642583904, 0.6523686016, 0.3977456272, 0.1515232662, 0.0291671582]


def ays(n):
    tab = [float(F(v)) for v in AYS_SD1]
    v = tab if n + 1 == len(tab) else ays_interp(tab, n + 1)
    v[n] = 0.0
    return v


def bong_ramp(steps, slope, pivot, start, end):
    if steps <= 0:
        return []
    f = lambda x: ((2 / math.pi) * math.atan(-slope * (x - pivot)) + 1) * 0.5
    smax, smin = f(0), f(steps - 1)
    srange = smax - smin
    if abs(srange) < 1e-8:
        if steps == 1:
            return [start]
        return [start + (end - start) * i / (steps - 1) for i in range(steps)]
    return [((f(x) - smin) / srange) * (start - end) + end for x in range(steps)]


def bong_tangent(n, smin, smax):  # upstream / RES4LYF bong_tangent
    middle = smin + (smax - smin) * 0.5
    steps = n + 2
    midpoint = int((steps * 0.6 + steps * 0.6) * 0.5)
    p1 = int(steps * 0.6)
    slope = 0.2 / (steps / 40)
    s2len = steps - midpoint
    s1len = steps - s2len
    a = bong_ramp(s1len, slope, p1, smax, middle)[:-1]
    b = bong_ramp(s2len, slope, p1 - s1len, middle, smin)
    v = (a + b + [smin] * (n + 1))[: n + 1]
    v[n] = 0.0
    return v


def stretch(v, n, terminal):
    scale = (1 - v[n - 1]) / (1 - terminal)
    for i in range(n):
        v[i] = 1 - (1 - v[i]) / scale


def flux(n, seq, base_len=256, max_len=4096, base=0.5, mx=1.15, terminal=0.0):
    m = (mx - base) / (max_len - base_len)
    mu = seq * m + (base - m * base_len)
    v = [0.0 if t <= 0 else math.exp(mu) / (math.exp(mu) + (1 / t - 1)) for t in (1 - i / n for i in range(n + 1))]
    if terminal > 0 and n > 1:
        stretch(v, n, terminal)
    v[n] = 0.0
    return v


def flux2(n, seq):
    a1, b1, a2, b2 = 8.73809524e-05, 1.89833333, 0.00016927, 0.45666666
    if seq > 4300:
        mu = a2 * seq + b2
    else:
        m200, m10 = a2 * seq + b2, a1 * seq + b1
        a = (m200 - m10) / 190.0
        mu = a * n + (m200 - 200.0 * a)
    v = [math.exp(mu) / (math.exp(mu) + (1 / t - 1)) if 0 < t < 1 else (1.0 if t >= 1 else 0.0)
         for t in (1 - i / n for i in range(n + 1))]
    v[n] = 0.0
    return v


def ltx2(n, seq, mx=2.05, base=0.95, terminal=0.1):
    m = (mx - base) / (4096 - 1024)
    es = math.exp(seq * m + base - m * 1024)
    v = []
    for i in range(n + 1):
        s = 1 - i / n
        v.append(es / (es + (1 / s - 1)) if s != 0 else 0.0)
    if len(v) > 2:
        stretch(v, n, terminal)
    v[n] = 0.0
    return v


def logit_normal(n, seq, mean=0.0, std=1.75, lo=-15.0, hi=18.0):
    from statistics import NormalDist
    if seq > 0:
        mean += 0.5 * math.log(seq / 1024)
    sig = lambda x: 1 / (1 + math.exp(-x))
    tmin, tmax = sig(0.5 * hi), sig(0.5 * lo)
    v = []
    for i in range(n + 1):
        t = i / n
        z = -NormalDist().inv_cdf(t) if 0 < t < 1 else (math.inf if t <= 0 else -math.inf)
        y = mean + std * z
        ts = sig(y) if abs(y) < 700 else (1.0 if y > 0 else 0.0)
        v.append(min(max(ts, tmax), tmin))
    v[n] = 0.0
    return v


def beta_sched(n, t2s, a=0.6, b=0.6):  # ComfyUI beta_scheduler (scipy ppf), dedup
    if n == 1:
        return [t2s(999.0), 0.0]
    out, last = [], -1
    for i in range(n):
        u = 1 - i / n
        # invert the CDF by bisection
        lo_, hi_ = 0.0, 1.0
        for _ in range(200):
            mid = 0.5 * (lo_ + hi_)
            if betainc(a, b, mid) < u:
                lo_ = mid
            else:
                hi_ = mid
        t = int(round(0.5 * (lo_ + hi_) * 999))
        if t != last:
            out.append(t2s(float(t)))
            last = t
    return out + [0.0]


def betainc(a, b, x):
    # regularised incomplete beta, continued fraction in f64 to 1e-15
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1 - x)
    lbeta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    front = math.exp(math.log(x) * a + math.log(1 - x) * b - lbeta) / a
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -((a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1 + num * d
        d = 1 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1 + num / c
        c = c if abs(c) > 1e-300 else 1e-300
        f *= c * d
        if abs(1 - c * d) < 1e-15:
            break
    return front * (f - 1)


def main_schedules():
    disc = t_to_sigma_discrete
    smin, smax = float(SIG[0]), float(SIG[999])
    fl = t_to_sigma_flow(3.0)
    fmin, fmax = fl(0.0), fl(999.0)
    cases = []

    def add(name, model, n, sig, **kw):
        cases.append(dict(schedule=name, model=model, steps=n, sigmas=[float(v) for v in sig], **kw))

    for n in [1, 2, 4, 10, 20, 30]:
        add("discrete", "sd", n, k_discrete(n, disc))
        add("discrete", "flow3", n, k_discrete(n, fl))
        add("sgm_uniform", "sd", n, sgm_uniform(n, disc))
        add("simple", "sd", n, simple(n, disc))
        add("smoothstep", "sd", n, smoothstep(n, disc))
        add("lcm", "sd", n, lcm(n, disc))
        add("kl_optimal", "sd", n, kl_optimal(n, smin, smax))
        add("beta", "sd", n, beta_sched(n, disc))
        add("flux", "none", n, flux(n, 4096), image_seq_len=4096)
        add("flux", "none", n, flux(n, 1024), image_seq_len=1024)
        add("flux", "qwen21", n, flux(n, 4096, max_len=8192, mx=0.9, terminal=0.02), image_seq_len=4096)
        add("flux2", "none", n, flux2(n, 4096), image_seq_len=4096)
        add("flux2", "none", n, flux2(n, 8192), image_seq_len=8192)
        add("ltx2", "none", n, ltx2(n, 6144), image_seq_len=6144)
        add("logit_normal", "none", n, logit_normal(n, 4096), image_seq_len=4096)
        if n >= 2:
            add("karras", "sd", n, k_karras(n, smin, smax))
            add("karras", "flow3", n, k_karras(n, fmin, fmax))
            add("exponential", "sd", n, k_exponential(n, smin, smax))
            add("bong_tangent", "sd", n, bong_tangent(n, smin, smax))
            add("bong_tangent", "flow3", n, bong_tangent(n, fmin, fmax))
        add("ays", "sd1", n, ays(n))
    write("schedules.json", cases)


# ------------------------------------------------------------------------ samplers
# f64 numpy transcriptions of the sampler loops. The analytic "model" and the noise
# replay are mirrored in tests/sampling.rs.

def model(x, s):
    return 0.9 * np.tanh(x) / (1 + s * s) + 0.05 * x * s / (1 + s)


def model_uncond(x, s):
    return 0.8 * np.tanh(x) / (1 + s * s)


class Replay:
    def __init__(self, seed, n):
        self.vals = torch.Generator().manual_seed(seed)
        self.noise = torch.randn(4096, generator=self.vals, dtype=torch.float64).numpy().astype(np.float32)
        self.pos = 0

    def randn(self, n):
        out = self.noise[self.pos:self.pos + n].astype(np.float64)
        self.pos += n
        return out


def anc(sf, st, eta):
    if eta <= 0:
        return st, 0.0
    up = 0.0
    if sf * sf > 0:
        up = min(st, eta * math.sqrt(max(st * st * (sf * sf - st * st) / (sf * sf), 0)))
    d2 = st * st - up * up
    return (math.sqrt(d2) if d2 > 0 else 0.0), up


def anc_flow(sf, st, eta):
    if eta <= 0 or sf <= 0 or st <= 0:
        return st, 0.0, 1.0
    eta = min(eta, 1.0)
    down = min(max(st * (1 + (st / sf - 1) * eta), 0.0), st)
    if 1 - down <= 0:
        return st, 0.0, 1.0
    a = (1 - st) / (1 - down)
    term = min(max((down / st) * a, -1.0), 1.0)
    return down, st * math.sqrt(max(1 - term * term, 0)), a


def ancx(sf, st, eta, flow):
    return anc_flow(sf, st, eta) if flow else (*anc(sf, st, eta), 1.0)


def s_euler(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        d = (x - model(x, sig[i])) / sig[i]
        x = x + d * (sig[i + 1] - sig[i])
    return x


def s_euler_a(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        s, st = sig[i], sig[i + 1]
        den = model(x, s)
        if st == 0:
            x = den
            continue
        down, up, a = (st, 0.0, 1.0) if eta == 0 else ancx(s, st, eta, flow)
        r = down / s
        x = r * x + (1 - r) * den
        if up > 0:
            if flow:
                x = x * a
            x = x + rng.randn(len(x)) * up
    return x


def s_heun(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        d = (x - model(x, sig[i])) / sig[i]
        dt = sig[i + 1] - sig[i]
        if sig[i + 1] == 0:
            x = x + d * dt
        else:
            x2 = x + d * dt
            d2 = (x2 - model(x2, sig[i + 1])) / sig[i + 1]
            x = x + (d + d2) / 2 * dt
    return x


def s_dpm2(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        d = (x - model(x, sig[i])) / sig[i]
        if sig[i + 1] == 0:
            x = x + d * (sig[i + 1] - sig[i])
        else:
            sm = math.exp(0.5 * (math.log(sig[i]) + math.log(sig[i + 1])))
            x2 = x + d * (sm - sig[i])
            x = x + (x2 - model(x2, sm)) / sm * (sig[i + 1] - sig[i])
    return x


def s_2s_a(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        s, st = sig[i], sig[i + 1]
        den = model(x, s)
        if not flow:
            down, up = anc(s, st, eta)
            if down == 0:
                x = den
            else:
                t, tn = -math.log(s), -math.log(down)
                h = tn - t
                ss = math.exp(-(t + 0.5 * h))
                x2 = (ss / s) * x - (math.exp(-h * 0.5) - 1) * den
                x = (down / s) * x - (math.exp(-h) - 1) * model(x2, ss)
            if st > 0:
                x = x + rng.randn(len(x)) * up
        else:
            if st == 0:
                x = den
                continue
            down, up, a = anc_flow(s, st, eta)
            if 1 - s < 1e-6:
                di = den
            else:
                es = math.sqrt(((1 - s) / s) * ((1 - down) / down))
                ss = 1 / (es + 1)
                r = ss / s
                di = model(x * r + den * (1 - r), ss)
            r = down / s
            x = x * r + di * (1 - r)
            if eta > 0:
                x = a * x + rng.randn(len(x)) * up
    return x


def s_2m(x, sig, rng, eta, flow, ex, v2=False):
    old = None
    for i in range(len(sig) - 1):
        den = model(x, sig[i])
        t, tn = -math.log(sig[i]), (-math.log(sig[i + 1]) if sig[i + 1] > 0 else math.inf)
        h = tn - t
        a = sig[i + 1] / sig[i]
        if i == 0 or sig[i + 1] == 0:
            x = a * x - (math.exp(-h) - 1) * den
        else:
            hl = t + math.log(sig[i - 1])
            if v2:
                hmin, hmax = min(hl, h), max(hl, h)
                r = hmax / hmin
                b = math.exp(-(hmax + hmin) / 2) - 1
            else:
                r = hl / h
                b = math.exp(-h) - 1
            x = a * x - b * ((1 + 1 / (2 * r)) * den - (1 / (2 * r)) * old)
        old = den
    return x


def s_2m_sde(x, sig, rng, eta, flow, ex):
    old, hl = None, 0.0
    for i in range(len(sig) - 1):
        den = model(x, sig[i])
        if sig[i + 1] == 0:
            x = den
        else:
            t, s_ = -math.log(sig[i]), -math.log(sig[i + 1])
            h = s_ - t
            eh = eta * h
            b = -math.expm1(-h - eh)
            x = sig[i + 1] / sig[i] * math.exp(-eh) * x + b * den
            if old is not None:
                x = x + 0.5 * b / (hl / h) * (den - old)
            if eta > 0:
                x = x + rng.randn(len(x)) * sig[i + 1] * math.sqrt(-math.expm1(-2 * eh))
            hl = h
        old = den
    return x


def ipndm_step(order, d, hist):
    if order == 1:
        return d
    if order == 2:
        return (3 * d - hist[-1]) / 2
    if order == 3:
        return (23 * d - 16 * hist[-1] + 5 * hist[-2]) / 12
    return (55 * d - 59 * hist[-1] + 37 * hist[-2] - 9 * hist[-3]) / 24


def s_ipndm(x, sig, rng, eta, flow, ex, v=False):
    hist = []
    for i in range(len(sig) - 1):
        d = (x - model(x, sig[i])) / sig[i]
        order = min(4, i + 1)
        h = sig[i + 1] - sig[i]
        if v and order == 2:
            q = h / (sig[i] - sig[i - 1])
            x = x + ((2 + q) * d - q * hist[-1]) / 2 * h
        else:
            x = x + ipndm_step(order, d, hist) * h
        hist = (hist + [d])[-3:]
    return x


def s_lcm(x, sig, rng, eta, flow, ex):
    n = len(sig) - 1
    for i in range(n):
        x = model(x, sig[i])
        if sig[i + 1] > 0:
            if flow:
                x = x * (1 - sig[i + 1])
            x = x + rng.randn(len(x)) * sig[i + 1]
    return x


def phi1(t):
    return 1 + t * 0.5 + t * t / 6 if abs(t) < 1e-6 else (math.exp(t) - 1) / t


def phi2(t):
    return 0.5 + t / 6 + t * t / 24 if abs(t) < 1e-6 else (phi1(t) - 1) / t


def s_res_multistep(x, sig, rng, eta, flow, ex):
    old, old_down = None, None
    for i in range(len(sig) - 1):
        den = model(x, sig[i])
        sf, st = sig[i], sig[i + 1]
        down, up, a = ancx(sf, st, eta, flow)
        if down == 0 or old_down is None:
            x = x + (x - den) / sf * (down - sf)
        else:
            t, told, tn, tp = -math.log(sf), -math.log(old_down), -math.log(down), -math.log(sig[i - 1])
            h = tn - t
            c2 = (tp - told) / h
            b1 = phi1(-h) - phi2(-h) / c2
            b2 = phi2(-h) / c2
            x = math.exp(-h) * x + h * (b1 * den + b2 * old)
        if st > 0 and up > 0:
            if flow:
                x = x * a
            x = x + rng.randn(len(x)) * up
        old, old_down = den, down
    return x


def s_res_2s(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        sf, st = sig[i], sig[i + 1]
        den = model(x, sf)
        down, up, a = ancx(sf, st, eta, flow)
        if down == 0:
            x = den
        else:
            t = -math.log(sf)
            h = -math.log(down) - t
            a21 = 0.5 * phi1(-h * 0.5)
            b2 = phi2(-h) / 0.5
            b1 = phi1(-h) - b2
            e1 = den - x
            x2 = x + e1 * (h * a21)
            e2 = model(x2, math.exp(-(t + h * 0.5))) - x
            x = x + h * (b1 * e1 + b2 * e2)
        if st > 0 and up > 0:
            if flow:
                x = x * a
            x = x + rng.randn(len(x)) * up
    return x


def s_euler_ge(x, sig, rng, eta, flow, ex, gamma=2.0):
    old = None
    for i in range(len(sig) - 1):
        s, st = sig[i], sig[i + 1]
        den = model(x, s)
        if st == 0:
            x = den
            continue
        down, up, a = ancx(s, st, eta, flow)
        d = (x - den) / s
        dt = down - s
        x = x + (d * gamma + old * (1 - gamma) if old is not None else d) * dt
        old = d
        if up > 0:
            if flow:
                x = x * a
            x = x + rng.randn(len(x)) * up
    return x


def lms_coeff_exact(sig, order, m, j):
    # exact integral of the Lagrange basis (k-diffusion uses scipy quad); upstream's
    # 1000-division midpoint rule differs by O(1e-7)
    pts = [sig[m - k] for k in range(order) if k != j]
    poly = np.poly1d([1.0])
    for p_ in pts:
        poly = poly * np.poly1d([1.0, -p_]) / (sig[m - j] - p_)
    ip = poly.integ()
    return ip(sig[m + 1]) - ip(sig[m])


def s_lms(x, sig, rng, eta, flow, ex, max_order=4, shift=1):
    steps = len(sig) - 1
    max_order = min(max_order, steps)
    hist = []
    for i in range(steps):
        d = (x - model(x, sig[i])) / sig[i]
        order = min(max_order, i + 1)
        c = [lms_coeff_exact(sig, order, i, j) for j in range(order)]
        x = x + d * c[0]
        if max_order > 1:
            sp1 = len(hist) + 1
            if i:
                for k in range(2, order + 1):
                    x = x + hist[min(len(hist) - 1, sp1 - k + shift)] * c[k - 1]
            if sp1 == max_order:
                hist.pop(0)
            hist.append(d)
    return x


def s_euler_cfg_pp(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        x = model(x, sig[i]) + (x - model_uncond(x, sig[i])) / sig[i] * sig[i + 1]
    return x


def s_euler_a_cfg_pp(x, sig, rng, eta, flow, ex):
    for i in range(len(sig) - 1):
        down, up = anc(sig[i], sig[i + 1], eta)
        x = model(x, sig[i]) + (x - model_uncond(x, sig[i])) / sig[i] * down
        if sig[i + 1] > 0:
            x = x + rng.randn(len(x)) * up
    return x


SAMPLERS = {
    "euler": s_euler, "euler_a": s_euler_a, "ddim_trailing": s_euler_a, "heun": s_heun,
    "dpm2": s_dpm2, "dpm++2s_a": s_2s_a, "dpm++2m": s_2m,
    "dpm++2mv2": lambda *a: s_2m(*a, v2=True), "dpm++2m_sde": s_2m_sde,
    "ipndm": s_ipndm, "ipndm_v": lambda *a: s_ipndm(*a, v=True), "lcm": s_lcm,
    "res_multistep": s_res_multistep, "res_2s": s_res_2s, "euler_ge": s_euler_ge,
    "lms": s_lms, "euler_cfg_pp": s_euler_cfg_pp, "euler_a_cfg_pp": s_euler_a_cfg_pp,
}

K_SIGMAS = [14.6146, 7.0, 3.1, 1.2, 0.5, 0.15, 0.0292, 0.0]
FLOW_SIGMAS = [1.0, 0.9, 0.72, 0.5, 0.3, 0.12, 0.0]
DEFAULT_ETA = {"euler_a": 1.0, "dpm++2s_a": 1.0, "euler_a_cfg_pp": 1.0, "dpm++2m_sde": 1.0}


def kdiff_crosscheck(x0, sig):
    """Checks the transcriptions against k-diffusion's own loops when available."""
    import importlib.util
    import sys
    import types
    spec = importlib.util.find_spec("k_diffusion")
    if spec is None:
        print("k-diffusion not installed: skipping cross-check")
        return
    path = os.path.join(os.path.dirname(spec.origin), "sampling.py")
    for name in ["scipy", "scipy.integrate", "torchdiffeq", "torchsde", "tqdm", "tqdm.auto"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["scipy"].integrate = sys.modules["scipy.integrate"]
    sys.modules["torchdiffeq"].odeint = None
    sys.modules["tqdm.auto"].trange = lambda *a, **k: range(*a)
    sys.modules["tqdm.auto"].tqdm = None
    pkg = types.ModuleType("kd_stub")
    pkg.__path__ = []
    utils = types.ModuleType("kd_stub.utils")
    utils.append_dims = lambda x, n: x[(...,) + (None,) * (n - x.ndim)]
    sys.modules["kd_stub"], sys.modules["kd_stub.utils"] = pkg, utils
    pkg.utils = utils
    src = open(path).read()
    mod = types.ModuleType("kd_stub.sampling")
    mod.__package__ = "kd_stub"
    exec(compile(src, path, "exec"), mod.__dict__)
    m = lambda x, s: torch.from_numpy(model(x.numpy(), float(s[0])))
    sig_t = torch.tensor(sig, dtype=torch.float64)
    checks = {"euler": mod.sample_euler, "heun": mod.sample_heun, "dpm2": mod.sample_dpm_2,
              "dpm++2m": mod.sample_dpmpp_2m}
    for name, fn in checks.items():
        ref = fn(m, torch.tensor(x0, dtype=torch.float64)[None], sig_t, disable=True).numpy()[0]
        ours = SAMPLERS[name](x0.copy(), sig, None, 0.0, False, {})
        assert np.abs(ref - ours).max() < 1e-12, name
    for name, fn in {"euler_a": mod.sample_euler_ancestral, "dpm++2s_a": mod.sample_dpmpp_2s_ancestral,
                     "dpm++2m_sde": mod.sample_dpmpp_2m_sde}.items():
        rng = Replay(7, 0)
        ns = lambda x: torch.from_numpy(rng.randn(x.numel()))
        ref = fn(m, torch.tensor(x0, dtype=torch.float64)[None], sig_t, disable=True,
                 noise_sampler=lambda a, b: ns(torch.zeros(len(x0)))[None]).numpy()[0]
        ours = SAMPLERS[name](x0.copy(), sig, Replay(7, 0), 1.0, False, {})
        assert np.abs(ref - ours).max() < 1e-12, (name, np.abs(ref - ours).max())
    print("k-diffusion cross-check passed (euler, heun, dpm2, dpm++2m, euler_a, dpm++2s_a, dpm++2m_sde)")


def main_samplers():
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(16, generator=gen, dtype=torch.float64).numpy().astype(np.float32).astype(np.float64)
    kdiff_crosscheck(base * K_SIGMAS[0], K_SIGMAS)
    cases = []
    for name, fn in SAMPLERS.items():
        for flow in [False, True]:
            if flow and name in ("euler_cfg_pp", "euler_a_cfg_pp"):
                continue
            sig = FLOW_SIGMAS if flow else K_SIGMAS
            x = base * (1.0 if flow else sig[0])
            etas = [DEFAULT_ETA.get(name, 0.0)]
            if name in ("euler_a", "res_multistep", "res_2s", "euler_ge", "dpm++2s_a", "dpm++2m_sde"):
                etas.append(0.5)
            for eta in etas:
                out = fn(x.copy(), sig, Replay(11, 0), eta, flow, {})
                cases.append(dict(sampler=name, flow=flow, eta=eta, sigmas=sig,
                                  x=[float(v) for v in x], out=[float(v) for v in out]))
    write("samplers.json", {"noise_seed": 11, "noise": [float(v) for v in Replay(11, 0).noise[:1024]],
                            "cases": cases})


if __name__ == "__main__":
    main_rng()
    main_schedules()
    main_samplers()
    # tcd / er_sde / dpm++2m_sde_bt and the --extra-sample-args schedule cases.
    import sampling_fixtures_more
    sampling_fixtures_more.main()
