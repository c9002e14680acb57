//! The `nereid-fetch` binary (`nereid_server::command::fetch`).

fn main() -> std::process::ExitCode {
    nereid_server::command::fetch::main(std::env::args_os())
}
