fn main() {
    let args: Vec<String> = std::env::args().collect();
    let exe = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| args[0].clone());
    std::process::exit(shoal_cli::run(args, vec![exe]));
}
