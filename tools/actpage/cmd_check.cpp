// Scaffolding: replaced by the real command.
#include <iostream>
#include "commands.hpp"
namespace actpage::cli {
int check(const CheckArgs&, std::ostream&, std::ostream& err) { err << "actpage check: not built yet\n"; return 2; }
}
