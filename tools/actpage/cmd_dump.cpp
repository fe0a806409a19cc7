// Scaffolding: replaced by the real command.
#include <iostream>
#include "commands.hpp"
namespace actpage::cli {
int dump(const DumpArgs&, std::ostream&, std::ostream& err) { err << "actpage dump: not built yet\n"; return 2; }
}
