//! The preview file (`--preview-path`): each preview replaces it atomically, so a viewer
//! never sees half a picture.

use super::PreviewSettings;
use crate::image_io::{write_generation_image, Channels, Image};
use crate::pipeline::preview::{PreviewMethod, PreviewSink};
use crate::tensor::HostTensor;

pub(super) struct FilePreview {
    settings: PreviewSettings,
    /// The run's last step (always previewed, so the file ends on the final latent).
    last_step: usize,
}

impl FilePreview {
    pub fn new(settings: PreviewSettings, steps: usize) -> Self {
        Self {
            settings,
            last_step: steps,
        }
    }
}

impl PreviewSink for FilePreview {
    fn method(&self) -> PreviewMethod {
        self.settings.method
    }

    fn noisy(&self) -> bool {
        self.settings.noisy
    }

    fn due(&self, step: usize) -> bool {
        step.is_multiple_of(self.settings.interval as usize) || step >= self.last_step
    }

    fn show(&mut self, step: usize, image: &HostTensor) {
        let (w, h) = (image.width() as u32, image.height() as u32);
        let written = Image::new(w, h, Channels::Rgb, image.to_u8_interleaved())
            .and_then(|img| write_generation_image(&self.settings.path, &img, None));
        match written {
            Ok(()) => log::debug!("preview of step {step}: {}", self.settings.path.display()),
            Err(e) => log::warn!("preview of step {step} not written: {e}"),
        }
    }
}
