//! Compiles `proto/tokenizer.proto` with the protoc binary vendored by `protoc-bin-vendored`,
//! so building needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/tokenizer.proto");
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY: build scripts are single-threaded; nothing else reads the environment yet.
        unsafe { std::env::set_var("PROTOC", protoc) };
    }
    tonic_prost_build::configure().compile_protos(&["proto/tokenizer.proto"], &["proto"])?;
    Ok(())
}
