"""The wmrl operator: kopf handlers around pure ``spec -> Kubernetes objects`` builders."""
