//! `tokenmill inspect PATH`: a GGUF file's metadata and tensor table.

use std::path::Path;

use tokenmill_gguf::GgufFile;

pub fn run(path: &Path) -> anyhow::Result<()> {
    let file = GgufFile::open(path)?;
    println!(
        "GGUF v{}  alignment {}  {}",
        file.version(),
        file.alignment(),
        path.display()
    );
    println!("\nmetadata ({} keys):", file.metadata().len());
    for (key, value) in file.metadata().iter() {
        println!("  {key} = {value}");
    }
    let tensors = file.tensors();
    let total: u64 = tensors.iter().map(|t| t.size).sum();
    println!(
        "\ntensors ({}, {:.1} MiB):",
        tensors.len(),
        total as f64 / (1u64 << 20) as f64
    );
    println!(
        "  {:<32} {:>6} {:>20} {:>12} {:>12}",
        "name", "type", "dims", "offset", "bytes"
    );
    for t in tensors {
        let dims = t
            .dims
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(" × ");
        println!(
            "  {:<32} {:>6} {:>20} {:>12} {:>12}",
            t.name,
            t.ty.name(),
            dims,
            t.offset,
            t.size
        );
    }
    Ok(())
}
