use super::RunConfig;
use crate::error::{Error, Result};
use crate::image_io::{format_text_chunks, read_png_text_chunks};

/// `-M metadata --image FILE`: prints the PNG's generation parameters and other text chunks.
pub fn run(cfg: &RunConfig) -> Result<()> {
    let path = cfg
        .metadata_image
        .as_ref()
        .ok_or_else(|| Error::Unsupported("metadata mode needs --image".into()))?;
    let chunks = read_png_text_chunks(path)?;
    print!("{}", format_text_chunks(path, &chunks));
    Ok(())
}
