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

/// Drops this process's resident pages of bytes `offset .. offset + len` of `map` (rounded out
/// to whole pages). The map is a shared read-only file mapping, so a later read faults the same
/// bytes back in from the file: this only lowers peak RSS while weights are copied out of it.
pub fn release_resident(map: &Mmap, offset: usize, len: usize) {
    if len == 0 || offset.checked_add(len).is_none_or(|end| end > map.len()) {
        return;
    }
    // SAFETY: MADV_DONTNEED on a MAP_SHARED, PROT_READ file mapping never changes what a read
    // returns (pages are re-read from the file); the range lies inside the map (checked above).
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
}
