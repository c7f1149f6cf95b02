//! Up-front checks of the frames: every encoder below may then assume a non-empty list of
//! same-sized frames whose buffers match their size (the `Image` fields are public, so a
//! buffer may not have gone through `Image::new`).

use std::path::Path;

use super::VideoError;
use crate::image_io::{Image, ImageIoError};

/// Checks `frames` and `fps`; returns the common (width, height).
pub(super) fn check(path: &Path, frames: &[Image], fps: u32) -> Result<(u32, u32), VideoError> {
    if fps == 0 {
        return Err(VideoError::ZeroFps {
            path: path.to_path_buf(),
        });
    }
    let first = frames.first().ok_or_else(|| VideoError::NoFrames {
        path: path.to_path_buf(),
    })?;
    for (index, frame) in frames.iter().enumerate() {
        let expected = (frame.width as usize)
            .checked_mul(frame.height as usize)
            .and_then(|p| p.checked_mul(frame.channels.count()));
        if frame.width == 0 || frame.height == 0 || expected != Some(frame.data.len()) {
            return Err(VideoError::BadFrame {
                path: path.to_path_buf(),
                index,
                source: ImageIoError::BadBuffer {
                    width: frame.width,
                    height: frame.height,
                    channels: frame.channels.count(),
                    len: frame.data.len(),
                },
            });
        }
        if (frame.width, frame.height) != (first.width, first.height) {
            return Err(VideoError::SizeMismatch {
                path: path.to_path_buf(),
                index,
                width: frame.width,
                height: frame.height,
                first_width: first.width,
                first_height: first.height,
            });
        }
    }
    Ok((first.width, first.height))
}
