extern "C" int actpage_placeholder() { return 0; }
