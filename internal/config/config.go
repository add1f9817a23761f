package config

import kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

var _ kpv1alpha1.KubeProxyConfiguration
