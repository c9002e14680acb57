//! The `nereid-server` binary (`nereid_server::command`).

fn main() -> std::process::ExitCode {
    nereid_server::command::main(std::env::args_os())
}
