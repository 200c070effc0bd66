//! Parse arbitrary bytes as GGUF; on success use the file the way a loader would.
//! Any panic, abort (e.g. a huge allocation), hang or out-of-bounds read is a bug.
#![no_main]

use kiln::gguf::{GgufFile, ModelSummary};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let mut checksum = 0u8;
    for t in file.tensors() {
        let bytes = file.tensor_bytes(t);
        assert_eq!(bytes.len(), t.n_bytes);
        assert!(bytes.file_offset() + bytes.len() <= file.file_size());
        // Touch every byte of every tensor.
        checksum = bytes.iter().fold(checksum, |a, &b| a ^ b);
        assert!(std::ptr::eq(file.tensor_info(&t.name).unwrap(), t));
    }
    for (key, value) in file.metadata() {
        assert!(file.get(key).is_some());
        let _ = value.to_string();
    }
    let summary = ModelSummary::from_file(&file);
    assert_eq!(summary.tensor_count, file.tensors().len());
    std::hint::black_box(checksum);
});
