//! Audio input and output: WAV files and the conversion of a reference clip to the audio
//! VAE's stereo rate.
//!
//! - [`read_wav`]: RIFF/WAVE with PCM 8 (unsigned), 16, 24 or 32-bit samples or IEEE float
//!   32/64-bit (plain or `WAVE_FORMAT_EXTENSIBLE`), any channel count, scaled to [-1, 1] as
//!   stable-diffusion.cpp's `load_wav_from_file` does (divided by 2^(bits−1)).
//! - [`write_wav`]: 16-bit PCM, samples clamped to [-1, 1] and rounded (half to even) from
//!   `x · 32767`, written atomically like every output (temporary file, fsync, rename).
//! - [`Audio::to_stereo`]: mono → both channels, more than two → the first two, then linear
//!   interpolation to the target rate and a clamp to [-1, 1], as upstream's
//!   `prepare_minimax_h3_reference_waveform` (diffusers resamples with torchaudio's windowed
//!   sinc instead; stable-diffusion.cpp is the spec).

mod resample;
mod wav;

pub use wav::{read_wav, read_wav_from_bytes, wav_bytes, write_wav, MAX_WAV_BYTES};

use std::path::PathBuf;

use thiserror::Error;

use super::ImageIoError;

/// A clip: `channels[c][i]` is sample i of channel c, nominally in [-1, 1].
#[derive(Clone, Debug, PartialEq)]
pub struct Audio {
    pub sample_rate: u32,
    /// Planar channels, all of the same length.
    pub channels: Vec<Vec<f32>>,
}

impl Audio {
    /// Samples per channel.
    pub fn len(&self) -> usize {
        self.channels.first().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Seconds of audio.
    pub fn duration(&self) -> f64 {
        if self.sample_rate == 0 {
            0.0
        } else {
            self.len() as f64 / f64::from(self.sample_rate)
        }
    }

    /// The clip as two channels at `rate` Hz (see the module docs); empty input gives empty
    /// channels.
    pub fn to_stereo(&self, rate: u32) -> Audio {
        let pick = |c: usize| -> &[f32] {
            match self.channels.len() {
                0 => &[],
                n => &self.channels[c.min(n - 1)],
            }
        };
        let channels = (0..2)
            .map(|c| resample::linear(pick(c), self.sample_rate, rate))
            .collect();
        Audio {
            sample_rate: rate,
            channels,
        }
    }
}

#[derive(Debug, Error)]
pub enum AudioIoError {
    #[error("cannot read '{}': {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("'{}' is not a usable WAV file: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("'{}': unsupported WAV sample format ({format})", path.display())]
    Unsupported { path: PathBuf, format: String },
    #[error("cannot write '{}' as WAV: {reason}", path.display())]
    Encode { path: PathBuf, reason: String },
    #[error(transparent)]
    Write(#[from] ImageIoError),
}
