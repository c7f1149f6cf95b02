//! A video's soundtrack as the containers store it: interleaved signed 16-bit PCM, each
//! sample `lrint(clamp(x, −1, 1) · 32767)` (upstream's conversion; ties to even).

use crate::image_io::audio::Audio;

/// Bytes per sample of one channel.
pub(super) const BYTES_PER_SAMPLE: u16 = 2;

pub(super) struct Pcm {
    pub rate: u32,
    pub channels: u16,
    /// Little-endian interleaved samples.
    pub bytes: Vec<u8>,
    /// Samples per channel.
    pub len: usize,
}

impl Pcm {
    pub fn of(audio: &Audio) -> Pcm {
        let len = audio.len();
        let channels = audio.channels.len();
        let mut bytes = Vec::with_capacity(len * channels * 2);
        for i in 0..len {
            for ch in &audio.channels {
                let x = ch.get(i).copied().unwrap_or(0.0);
                let x = if x.is_finite() { x } else { 0.0 };
                let v = (x.clamp(-1.0, 1.0) * 32767.0).round_ties_even() as i16;
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        Pcm {
            rate: audio.sample_rate,
            channels: channels as u16,
            bytes,
            len,
        }
    }

    /// Bytes of one sample frame (all channels).
    pub fn block_align(&self) -> u16 {
        self.channels * BYTES_PER_SAMPLE
    }

    /// The bytes of sample frames `start .. end` (clamped to the clip).
    pub fn span(&self, start: usize, end: usize) -> &[u8] {
        let b = usize::from(self.block_align());
        let (s, e) = (start.min(self.len), end.min(self.len));
        &self.bytes[s * b..e.max(s) * b]
    }
}
