// Scaffolding: replaced by the real command.
#include <iostream>
#include "commands.hpp"
namespace actpage::cli {
int run(const RunArgs&, std::ostream& err) { err << "actpage run: not built yet\n"; return 2; }
}
