//! SDXL's vector conditioning `y`: the pooled text embedding followed by sinusoidal features
//! of the micro-conditions (diffusers `get_aug_embed` "text_time"; upstream's conditioner
//! builds the same vector on the host).

use super::config::UNetConfig;
use crate::nn::timestep_embedding;
use crate::runner::RunnerError;

/// Period of the micro-condition sinusoids.
const MAX_PERIOD: f32 = 10_000.0;

/// SDXL base micro-conditions in diffusers' `add_time_ids` order: original (height, width),
/// crop (top, left), target (height, width), in pixels. Upstream passes the output size as
/// both sizes and a (0, 0) crop.
pub fn sdxl_time_ids(
    original: (f32, f32),
    crop_top_left: (f32, f32),
    target: (f32, f32),
) -> [f32; 6] {
    [
        original.0,
        original.1,
        crop_top_left.0,
        crop_top_left.1,
        target.0,
        target.1,
    ]
}

/// SDXL refiner micro-conditions: original (height, width), crop (top, left), aesthetic score
/// (diffusers' defaults: 6.0 for the prompt, 2.5 for the negative prompt).
pub fn refiner_time_ids(
    original: (f32, f32),
    crop_top_left: (f32, f32),
    aesthetic_score: f32,
) -> [f32; 5] {
    [
        original.0,
        original.1,
        crop_top_left.0,
        crop_top_left.1,
        aesthetic_score,
    ]
}

fn bad(reason: String) -> RunnerError {
    RunnerError::BadData {
        key: "y".into(),
        origin: "UNet vector conditioning".into(),
        reason,
    }
}

impl UNetConfig {
    /// Width of each micro-condition's sinusoidal features when `y` holds a `pooled_dim`-wide
    /// text embedding and `count` micro-conditions: (adm − pooled) / count (256 in SDXL).
    pub fn micro_condition_width(
        &self,
        pooled_dim: usize,
        count: usize,
    ) -> Result<usize, RunnerError> {
        let adm = self
            .adm_in_channels
            .ok_or_else(|| bad("this UNet takes no vector conditioning".into()))?;
        let rest = adm.saturating_sub(pooled_dim);
        if count == 0 || rest == 0 || !rest.is_multiple_of(count) {
            return Err(bad(format!(
                "{adm} conditioning channels do not hold a {pooled_dim}-wide pooled embedding \
                 and {count} equally wide micro-condition embeddings"
            )));
        }
        Ok(rest / count)
    }

    /// One batch element's `y` [adm_in_channels]: `pooled` followed by the [cos | sin]
    /// features (flip_sin_to_cos, shift 0) of each value of `time_ids` ([`sdxl_time_ids`],
    /// [`refiner_time_ids`]). Concatenate the elements of a batch for `y` [adm, B].
    pub fn adm_vector(&self, pooled: &[f32], time_ids: &[f32]) -> Result<Vec<f32>, RunnerError> {
        let width = self.micro_condition_width(pooled.len(), time_ids.len())?;
        let mut y = pooled.to_vec();
        y.extend(timestep_embedding(
            time_ids, width, true, 0.0, 1.0, MAX_PERIOD,
        ));
        Ok(y)
    }
}
