#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| rustconv_fuzz::execute::run(data));
