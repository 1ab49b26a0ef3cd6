//! `loopguard`: the operators' command line (see `loopguard --help`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = loopguard::cli::run(&args, &mut std::io::stdout(), &mut std::io::stderr());
    std::process::exit(code);
}
