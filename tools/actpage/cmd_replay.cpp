// Scaffolding: replaced by the real command.
#include <iostream>
#include "commands.hpp"
namespace actpage::cli {
int replay(const ReplayArgs&, std::ostream&, std::ostream& err) { err << "actpage replay: not built yet\n"; return 2; }
}
