//! The packed audio+video latent the samplers run on (upstream's MiniMax-H3 AV flow denoiser).
//!
//! The sampler state is one latent [W, H, T, C + k]: the video latent's C channels, then the
//! audio values (T_a fastest, then the stereo stream, then the audio channel) and zero
//! padding up to whole planes. Video follows the schedule's σ_v; audio has its own shift
//! (σ_a = the audio shift applied to σ_v's unshifted value), so the sampler carries
//! c_a = (σ_v / σ_a) · x_a, which for fixed noise n and data x0 is σ_v·n + r·(1 − σ_v)·x0
//! with r = video shift / audio shift: a flow latent on the video schedule whose data is
//! r·x0. Its velocity is n − r·x0 = (1 − r)·x_a + (1 + (r − 1)·σ_a)·v_a for the audio
//! velocity v_a = n − x0, and the sampled carrier divided by r is the audio latent. An Euler
//! step on the carrier is exactly an Euler step of x_a over the σ_a grid (diffusers' second
//! scheduler).

/// The shift of the audio stream (upstream hard-codes it; diffusers' `audio_flow_shift`).
pub const AUDIO_SHIFT: f32 = 3.0;

/// σ on a schedule shifted by `from` moved to one shifted by `to` (same unshifted point).
pub fn remap_sigma(sigma: f32, from: f32, to: f32) -> f32 {
    let base = sigma / (from + sigma * (1.0 - from));
    to * base / (1.0 + (to - 1.0) * base)
}

/// Where the parts of a packed latent live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packing {
    /// Video latent (W, H, T) and channels.
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    pub channels: usize,
    /// Audio latents per stream and audio channels.
    pub audio_len: usize,
    pub audio_channels: usize,
}

impl Packing {
    pub fn plane(&self) -> usize {
        self.width * self.height * self.frames
    }

    pub fn video_values(&self) -> usize {
        self.plane() * self.channels
    }

    pub fn audio_values(&self) -> usize {
        self.audio_len * 2 * self.audio_channels
    }

    /// Channels of the packed latent: the video's plus the planes the audio fills.
    pub fn packed_channels(&self) -> usize {
        self.channels + self.audio_values().div_ceil(self.plane())
    }

    /// The sampler's latent shape (W, H, T · packed channels).
    pub fn shape(&self) -> (usize, usize, usize) {
        (
            self.width,
            self.height,
            self.frames * self.packed_channels(),
        )
    }

    pub fn len(&self) -> usize {
        self.plane() * self.packed_channels()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (video, audio) slices of a packed latent.
    pub fn split<'a>(&self, x: &'a [f32]) -> (&'a [f32], &'a [f32]) {
        let v = self.video_values();
        (&x[..v], &x[v..v + self.audio_values()])
    }

    /// A packed latent of `video` and `audio` (zero padding after).
    pub fn join(&self, video: &[f32], audio: &[f32]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        out.extend_from_slice(video);
        out.extend_from_slice(audio);
        out.resize(self.len(), 0.0);
        out
    }

    /// Audio rows [C_a, 2·T_a] (row = stream · T_a + t, channel fastest) of audio values.
    pub fn audio_rows(&self, audio: &[f32]) -> Vec<f32> {
        let (n, c) = (self.audio_len, self.audio_channels);
        let mut rows = vec![0f32; audio.len()];
        for ch in 0..c {
            for s in 0..2 {
                for t in 0..n {
                    rows[(s * n + t) * c + ch] = audio[(ch * 2 + s) * n + t];
                }
            }
        }
        rows
    }

    /// The inverse of [`Packing::audio_rows`].
    pub fn audio_values_of_rows(&self, rows: &[f32]) -> Vec<f32> {
        let (n, c) = (self.audio_len, self.audio_channels);
        let mut audio = vec![0f32; rows.len()];
        for ch in 0..c {
            for s in 0..2 {
                for t in 0..n {
                    audio[(ch * 2 + s) * n + t] = rows[(s * n + t) * c + ch];
                }
            }
        }
        audio
    }
}

/// The schedule point of one model call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CarrierPoint {
    pub sigma_v: f32,
    pub sigma_a: f32,
    /// Video shift / audio shift.
    pub ratio: f32,
}

impl CarrierPoint {
    pub fn new(sigma: f32, video_shift: f32) -> Self {
        let sigma_v = sigma.clamp(1e-6, 1.0);
        Self {
            sigma_v,
            sigma_a: remap_sigma(sigma_v, video_shift, AUDIO_SHIFT),
            ratio: video_shift / AUDIO_SHIFT,
        }
    }

    /// The audio latent the network sees, from the carrier.
    pub fn audio_in(&self, carrier: &[f32]) -> Vec<f32> {
        let s = self.sigma_a / self.sigma_v;
        carrier.iter().map(|c| c * s).collect()
    }

    /// The carrier's velocity from the audio latent and the audio velocity (noise − data).
    pub fn carrier_velocity(&self, x_a: &[f32], v_a: &[f32]) -> Vec<f32> {
        let a = 1.0 - self.ratio;
        let b = 1.0 + (self.ratio - 1.0) * self.sigma_a;
        x_a.iter().zip(v_a).map(|(x, v)| a * x + b * v).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remap_fixes_the_ends_and_follows_the_shifts() {
        assert!((remap_sigma(1.0, 12.0, 3.0) - 1.0).abs() < 1e-6);
        assert_eq!(remap_sigma(0.0, 12.0, 3.0), 0.0);
        // Unshifted 0.5: video 12/13, audio 3/4.
        assert!((remap_sigma(12.0 / 13.0, 12.0, 3.0) - 0.75).abs() < 1e-6);
    }

    #[test]
    fn euler_on_the_carrier_is_euler_on_the_audio_schedule() {
        // Fixed noise n and data x0: the carrier's Euler step lands on the audio latent
        // of the next audio sigma, scaled to the carrier.
        let (n, x0) = (0.7f32, -1.3f32);
        let shift = 12.0;
        for (s, s_next) in [(1.0f32, 0.8f32), (0.5, 0.2), (0.2, 0.0)] {
            let p = CarrierPoint::new(s, shift);
            let x_a = (1.0 - p.sigma_a) * x0 + p.sigma_a * n;
            let c = x_a * p.sigma_v / p.sigma_a;
            let v = p.carrier_velocity(&[x_a], &[n - x0])[0];
            let c_next = c + (s_next - s) * v;
            let want = if s_next == 0.0 {
                p.ratio * x0
            } else {
                let q = CarrierPoint::new(s_next, shift);
                ((1.0 - q.sigma_a) * x0 + q.sigma_a * n) * q.sigma_v / q.sigma_a
            };
            assert!(
                (c_next - want).abs() < 1e-5,
                "{s}->{s_next}: {c_next} vs {want}"
            );
        }
    }

    #[test]
    fn audio_rows_round_trip() {
        let p = Packing {
            width: 2,
            height: 2,
            frames: 1,
            channels: 3,
            audio_len: 3,
            audio_channels: 2,
        };
        let audio: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let rows = p.audio_rows(&audio);
        // Row 1 (stream 0, t 1): channel 0 is audio[1], channel 1 audio[(1·2 + 0)·3 + 1].
        assert_eq!(&rows[2..4], &[1.0, 7.0]);
        assert_eq!(p.audio_values_of_rows(&rows), audio);
        assert_eq!(p.packed_channels(), 6);
        assert_eq!(p.len(), 24);
    }
}
