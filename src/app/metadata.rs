use super::RunConfig;
use crate::error::{Error, Result};
use crate::image_io::{format_metadata, read_text_metadata};

/// `-M metadata --image FILE`: prints the image's generation parameters and other text
/// metadata (PNG text chunks, JPEG EXIF/COM, WebP EXIF/XMP).
pub fn run(cfg: &RunConfig) -> Result<()> {
    let path = cfg
        .metadata_image
        .as_ref()
        .ok_or_else(|| Error::Unsupported("metadata mode needs --image".into()))?;
    let (format, chunks) = read_text_metadata(path)?;
    print!("{}", format_metadata(path, format, &chunks));
    Ok(())
}
