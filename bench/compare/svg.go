package compare

func Chart(rep *Report, fault string) ([]byte, bool) { return nil, false }
