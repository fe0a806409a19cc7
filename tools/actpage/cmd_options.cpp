// Scaffolding: replaced by the real command.
#include <iostream>
#include "commands.hpp"
namespace actpage::cli {
int options(const OptionsArgs&, std::ostream& out) { out << "not built yet\n"; return 2; }
}
