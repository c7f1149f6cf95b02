//! Classifier-free guidance combines (upstream `ClassifierFreeGuidance`).

use super::SamplingError;

fn check(a: &[f32], b: &[f32], what: &'static str) -> Result<(), SamplingError> {
    if a.len() != b.len() {
        return Err(SamplingError::LengthMismatch {
            what,
            expected: a.len(),
            got: b.len(),
        });
    }
    Ok(())
}

/// `uncond + scale * (cond - uncond)`.
pub fn cfg(cond: &[f32], uncond: &[f32], scale: f32) -> Result<Vec<f32>, SamplingError> {
    check(cond, uncond, "cfg: uncond vs cond")?;
    Ok(cond
        .iter()
        .zip(uncond)
        .map(|(c, u)| u + scale * (c - u))
        .collect())
}

/// Instruct-pix2pix style guidance with an image-unconditional prediction:
/// `img_uncond + img_scale * (uncond - img_uncond) + scale * (cond - uncond)`.
pub fn cfg_with_image(
    cond: &[f32],
    uncond: &[f32],
    img_uncond: &[f32],
    scale: f32,
    img_scale: f32,
) -> Result<Vec<f32>, SamplingError> {
    check(cond, uncond, "cfg: uncond vs cond")?;
    check(cond, img_uncond, "cfg: image-uncond vs cond")?;
    Ok(cond
        .iter()
        .zip(uncond)
        .zip(img_uncond)
        .map(|((c, u), i)| i + img_scale * (u - i) + scale * (c - u))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cfg_values() {
        assert_eq!(cfg(&[2.0], &[1.0], 7.0).unwrap(), vec![8.0]);
        assert_eq!(cfg(&[2.0], &[1.0], 1.0).unwrap(), vec![2.0]);
        assert!(cfg(&[2.0], &[], 1.0).is_err());
        assert_eq!(
            cfg_with_image(&[3.0], &[2.0], &[1.0], 2.0, 1.5).unwrap(),
            vec![1.0 + 1.5 + 2.0]
        );
    }
}
