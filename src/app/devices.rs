use crate::ggml::list_devices;

/// `--list-devices`: every device ggml can run on in this build.
pub fn print_devices() {
    println!(
        "CPU: {}",
        crate::cpu_info::cpu_line(crate::cli::physical_cores() as usize)
    );
    println!("Available compute devices:");
    for d in list_devices() {
        let gib = |b: usize| b as f64 / (1024.0 * 1024.0 * 1024.0);
        println!(
            "  {:<12} {:<40} {:?}, {:.1} GiB free of {:.1} GiB",
            d.name,
            d.description,
            d.kind,
            gib(d.memory_free),
            gib(d.memory_total)
        );
    }
}
