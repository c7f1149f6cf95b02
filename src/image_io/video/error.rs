//! The one error type of video writing; every variant names the output.

use std::path::PathBuf;

use crate::image_io::ImageIoError;

/// Why a video (or image sequence) could not be written.
#[derive(Debug, thiserror::Error)]
pub enum VideoError {
    #[error(
        "cannot write video '{}': unknown output kind; use .avi (Motion-JPEG), .webm (VP8), \
         .webp (animated, lossless) or a %d pattern such as frames_%03d.png",
        path.display()
    )]
    UnknownFormat { path: PathBuf },
    #[error("cannot write video '{}': there are no frames", path.display())]
    NoFrames { path: PathBuf },
    #[error("cannot write video '{}': the frame rate must be at least 1 fps", path.display())]
    ZeroFps { path: PathBuf },
    #[error(
        "cannot write video '{}': frame {index} is {width}x{height} but frame 0 is \
         {first_width}x{first_height}; all frames must have the same size",
        path.display()
    )]
    SizeMismatch {
        path: PathBuf,
        index: usize,
        width: u32,
        height: u32,
        first_width: u32,
        first_height: u32,
    },
    #[error("cannot write video '{}': frame {index}: {source}", path.display())]
    BadFrame {
        path: PathBuf,
        index: usize,
        #[source]
        source: ImageIoError,
    },
    #[error("cannot write video '{}': {reason}", path.display())]
    TooLarge { path: PathBuf, reason: String },
    #[error("cannot encode video '{}': {message}", path.display())]
    Encode { path: PathBuf, message: String },
    /// Writing the file (or one image of a sequence) failed; the inner error names the file.
    #[error(transparent)]
    Image(#[from] ImageIoError),
    /// Writing the soundtrack's `.wav` failed; the inner error names the file.
    #[error(transparent)]
    Audio(#[from] crate::image_io::audio::AudioIoError),
}
