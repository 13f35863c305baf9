//! Fuzz target: `GgufFile::from_bytes` on arbitrary bytes must return `Ok` or `Err`, never
//! panic, and a parsed file's accessors must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmill_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        assert_eq!(file.tensor_data(t).len() as u64, t.size);
        assert!(file.tensor(&t.name).is_some());
    }
    for (key, value) in file.metadata().iter() {
        assert!(file.metadata().get(key).is_some());
        let _ = value.to_string();
    }
    let _ = file.architecture();
});
