//! Qwen2.5-VL's image processor settings. The processor is the Qwen2-VL one that Qwen3-VL also
//! uses, so resizing and patchify are `qwen3_vl_vision`'s; only the defaults differ.

use crate::models::te::qwen3_vl_vision::VisionPreprocessConfig;

/// OpenAI CLIP's normalisation, which Qwen2.5-VL's `preprocessor_config.json` names (written to
/// f32 precision: 0.26130258 and 0.27577711 round to the same floats).
pub const CLIP_IMAGE_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
pub const CLIP_IMAGE_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

/// The released Qwen2.5-VL `preprocessor_config.json`: patch 14, 2 frames, merge 2, CLIP
/// mean/std, 3136 ≤ pixels ≤ 12845056. Apply a file's values over it with
/// [`VisionPreprocessConfig::with_json`] / [`VisionPreprocessConfig::with_gguf`].
pub fn qwen25_vl_preprocess_config() -> VisionPreprocessConfig {
    VisionPreprocessConfig {
        patch_size: 14,
        temporal_patch_size: 2,
        merge_size: 2,
        image_mean: CLIP_IMAGE_MEAN,
        image_std: CLIP_IMAGE_STD,
        min_pixels: 3136,
        max_pixels: 12_845_056,
        rescale_factor: 1.0 / 255.0,
    }
}
