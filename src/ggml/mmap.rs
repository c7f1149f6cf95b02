//! Read-only memory maps of model files (kept here so all `unsafe` stays in this module).

use std::fs::File;

use memmap2::Mmap;

/// Maps `file` read-only.
pub fn map_readonly(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and never handed out mutably; the remaining hazard (another
    // process truncating the file while it is mapped) is inherent to mmap, as in every
    // GGUF/safetensors loader, and all offsets are validated against the mapped length.
    unsafe { Mmap::map(file) }
}
