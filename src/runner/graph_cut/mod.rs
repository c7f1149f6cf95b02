//! Graph-cut segmented execution and weight residency: running graphs (and models) larger
//! than the device.
//!
//! Models mark block boundaries with [`GraphCtx::cut`](super::GraphCtx::cut). Each call, the
//! runner measures the whole graph; when its weights, compute buffer and cache do
//! not fit the device budget (with [`PLANNING_HEADROOM`] to spare), it runs the graph as a
//! sequence of segments split at the cuts ([`plan`]): every segment gets the shared compute
//! buffer to itself, hand-over tensors live in buffers of their own for just as long as they
//! are needed, and offloaded weights are copied to the device segment by segment
//! ([`residency`]), the next segment's while the current one runs where the device can.
//! Segmented and monolithic runs execute the same nodes with the same kernels in the same
//! order, so their results are identical.

mod executor;
mod plan;
mod residency;

pub(crate) use executor::execute;
pub(crate) use residency::Residency;

/// Spare room the whole graph must leave to run monolithically (absorbs estimate drift).
pub const PLANNING_HEADROOM: usize = 128 << 20;
/// Device memory never planned for on a GPU (driver scratch, fragmentation).
pub const GPU_SCRATCH_RESERVE: usize = 512 << 20;

/// Where one device's budget comes from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum VramLimit {
    /// The device's free memory at each call (`0`, the default); no limit on the CPU.
    #[default]
    DeviceFree,
    /// A managed budget in bytes (a positive value), enforced on every device, the CPU too.
    Budget(usize),
    /// The device's free memory when the runner is created, less this many bytes (a
    /// negative value), as a managed budget.
    FreeMinus(usize),
}

impl VramLimit {
    /// From GiB: > 0 a budget, 0 the device's free memory, < 0 free memory at start less
    /// that much.
    pub fn from_gib(gib: f64) -> Self {
        let bytes = |g: f64| (g.abs() * (1u64 << 30) as f64) as usize;
        if !gib.is_finite() || gib == 0.0 {
            VramLimit::DeviceFree
        } else if gib > 0.0 {
            VramLimit::Budget(bytes(gib))
        } else {
            VramLimit::FreeMinus(bytes(gib))
        }
    }
}

/// `--max-vram`: a limit for every device and per-device overrides.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MaxVram {
    pub default: VramLimit,
    /// (device registry name, limit), matched case-insensitively.
    pub per_device: Vec<(String, VramLimit)>,
}

impl MaxVram {
    /// Parses `--max-vram` as upstream does: comma-separated items, each GiB (the limit for
    /// every device; the last one wins), `device=GiB`, or `all=GiB` / `default=GiB` / `*=GiB`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let gib = |v: &str| -> Result<VramLimit, String> {
            v.trim()
                .parse::<f64>()
                .ok()
                .filter(|g| g.is_finite())
                .map(VramLimit::from_gib)
                .ok_or_else(|| format!("'{}' is not a number of GiB", v.trim()))
        };
        let mut out = MaxVram::default();
        for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            match item.split_once('=') {
                None => out.default = gib(item)?,
                Some((dev, v)) => {
                    let (dev, v) = (dev.trim(), v.trim());
                    if dev.is_empty() || v.is_empty() {
                        return Err(format!("'{item}' is not device=GiB"));
                    }
                    let limit = gib(v)?;
                    if ["all", "default", "*"].contains(&dev.to_ascii_lowercase().as_str()) {
                        out.default = limit;
                    } else {
                        out.per_device.retain(|(d, _)| !d.eq_ignore_ascii_case(dev));
                        out.per_device.push((dev.to_string(), limit));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The limit that applies to the device named `device`.
    pub fn for_device(&self, device: &str) -> VramLimit {
        self.per_device
            .iter()
            .find(|(d, _)| d.eq_ignore_ascii_case(device))
            .map_or(self.default.clone(), |(_, v)| v.clone())
    }

    /// One limit for every device.
    pub fn all(limit: VramLimit) -> Self {
        Self {
            default: limit,
            per_device: Vec::new(),
        }
    }
}

/// How a runner uses device memory (`--max-vram`, `--offload-to-cpu`, `--disable-prefetch`,
/// `--disable-segmented-compute`).
#[derive(Clone, Debug)]
pub struct MemoryOptions {
    pub max_vram: MaxVram,
    /// Keep weights in host memory and copy them to the device as segments need them.
    /// Applies when weights are loaded ([`WeightLoader::finish_for`](super::WeightLoader::finish_for)).
    pub offload_to_cpu: bool,
    /// Upload the next segment's weights while the current one runs (on devices with
    /// asynchronous copies).
    pub prefetch: bool,
    /// Tests: prefetch even on devices without asynchronous copies (synchronously, one
    /// segment ahead), so the CPU backend exercises the same planning.
    pub sync_prefetch: bool,
    /// Allow segmented execution (off: always monolithic, failing when it does not fit).
    pub segmented: bool,
    /// Diagnostics and tests: run segmented whenever the graph has cuts, even if it fits.
    pub force_segmented: bool,
    /// See [`PLANNING_HEADROOM`].
    pub planning_headroom: usize,
    /// See [`GPU_SCRATCH_RESERVE`] (not applied on the CPU).
    pub scratch_reserve: usize,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        Self {
            max_vram: MaxVram::default(),
            offload_to_cpu: false,
            prefetch: true,
            sync_prefetch: false,
            segmented: true,
            force_segmented: false,
            planning_headroom: PLANNING_HEADROOM,
            scratch_reserve: GPU_SCRATCH_RESERVE,
        }
    }
}

/// What one segment did (bytes are device bytes).
#[derive(Clone, Debug, Default)]
pub struct SegmentReport {
    pub name: String,
    pub nodes: usize,
    /// Weights the segment reads.
    pub weight_bytes: usize,
    /// Its compute buffer (intermediates).
    pub compute_bytes: usize,
    /// Hand-over tensors, inputs and outputs alive while it ran.
    pub pinned_bytes: usize,
    /// Weights copied to the device for it (before it ran).
    pub loaded_bytes: usize,
    /// Weights of the next segment uploaded while it ran.
    pub prefetched_bytes: usize,
    /// Device copies of weights freed to make room for it.
    pub evicted_bytes: usize,
    /// Accounted device memory while it ran.
    pub device_bytes: usize,
    /// The least device memory it can run in (resident weights, cache, compute buffer,
    /// hand-over tensors, and its own weights when offloaded); a budget below the largest of
    /// these fails.
    pub required_bytes: usize,
}

/// What the last call of a runner did.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    pub segmented: bool,
    /// One entry per segment (one for a monolithic run).
    pub segments: Vec<SegmentReport>,
    /// Highest accounted device memory during the call.
    pub peak_bytes: usize,
    /// The limit it planned against, if any.
    pub capacity: Option<usize>,
}

impl RunReport {
    pub fn loaded_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.loaded_bytes).sum()
    }
    pub fn prefetched_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.prefetched_bytes).sum()
    }
    pub fn evicted_bytes(&self) -> usize {
        self.segments.iter().map(|s| s.evicted_bytes).sum()
    }
}

pub(crate) fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Bytes for messages: B, KiB, MiB or GiB with two decimals.
pub(crate) fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.2} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.2} GiB", b / (1024.0 * 1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_vram_grammar_is_upstreams() {
        let gib = 1usize << 30;
        assert_eq!(MaxVram::parse("").unwrap(), MaxVram::default());
        assert_eq!(
            MaxVram::parse("6").unwrap(),
            MaxVram::all(VramLimit::Budget(6 * gib))
        );
        // Plain values set the default, the last one winning; devices get their own.
        let m = MaxVram::parse("cuda0=6, -2,1,Vulkan0=0").unwrap();
        assert_eq!(m.default, VramLimit::Budget(gib));
        assert_eq!(m.for_device("CUDA0"), VramLimit::Budget(6 * gib));
        assert_eq!(m.for_device("vulkan0"), VramLimit::DeviceFree);
        assert_eq!(m.for_device("cpu"), VramLimit::Budget(gib));
        assert_eq!(
            MaxVram::parse("all=-1").unwrap().default,
            VramLimit::FreeMinus(gib)
        );
        for bad in ["lots", "cuda0=", "=4", "cuda0=x", "inf"] {
            assert!(MaxVram::parse(bad).is_err(), "{bad}");
        }
    }
}
