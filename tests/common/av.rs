//! Reference video frames and soundtracks of the whole-run suites (Wan-style [F, 3, H, W]
//! frame tensors in [0, 1], [channels, samples] waveforms), and their comparison.

use sd_cli::tensor::HostTensor;
use sd_cli::weights::TensorStore;

use super::{image_bytes, tensor};

/// The frames of reference tensor `name` ([F, 3, H, W] in [0, 1]) as 8-bit RGB, all frames
/// in order, and their count.
pub fn reference_frames(store: &TensorStore, name: &str) -> (usize, Vec<u8>) {
    let v = tensor(store, name);
    let [w, h, c, f] = v.ne;
    let mut all = Vec::new();
    for i in 0..f {
        let one = HostTensor {
            ne: [w, h, c, 1],
            data: v.data[i * w * h * c..(i + 1) * w * h * c].to_vec(),
        };
        all.extend(image_bytes(&one));
    }
    (f, all)
}

/// The waveform of reference tensor `name` ([channels, samples]) per channel.
pub fn reference_audio(store: &TensorStore, name: &str) -> Vec<Vec<f32>> {
    let a = tensor(store, name);
    let n = a.ne[0];
    a.data.chunks(n).map(<[f32]>::to_vec).collect()
}

/// SNR (dB) of `got` against `want`, all channels.
pub fn snr(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    assert_eq!(got.len(), want.len(), "channels");
    let (mut sig, mut err) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len(), "samples per channel");
        for (a, b) in g.iter().zip(w) {
            sig += f64::from(*b).powi(2);
            err += f64::from(a - b).powi(2);
        }
    }
    10.0 * (sig / err.max(1e-30)).log10()
}
