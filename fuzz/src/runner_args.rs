//! Target `args`: pte_runner's command-line parser. The input is the
//! argument list, arguments separated by NUL bytes (invalid UTF-8 replaced,
//! as no `String` can hold it). What it accepts must keep the parser's
//! promises, which `main.rs` relies on.

use rustconv_pte_runner::args::parse;

pub fn run(data: &[u8]) {
    let argv = data
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned());
    let Ok(args) = parse(argv) else {
        return;
    };
    if args.help {
        return;
    }
    assert!(args.iter >= 1, "-iter 0 accepted");
    assert!(args.num_threads != Some(0) && args.rustconv_threads != Some(0));
    assert!(args.steps_npz_paths.is_empty() || args.inputs_npz_path.is_none());
    if let Some(n) = args.decode_steps {
        assert!(
            args.steps_npz_paths.len() > n,
            "fewer calls than -decode_steps + 1"
        );
    }
}
