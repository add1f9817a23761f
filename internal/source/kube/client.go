package kube

import (
	"context"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/vipproxy/vipproxy/internal/source/convert"
)

// Client is the part of the Kubernetes API the source uses: Services and
// EndpointSlices in every namespace, and Nodes.
//
// NewClient makes one from a rest.Config that knows only those two API
// groups, so the binary does not link client-go's clientset, informers
// and listers for every built-in group (kube-proxy's does). Tests adapt
// client-go's fake clientset with ResourceFuncs.
type Client struct {
	Services       Resource
	EndpointSlices Resource
	Nodes          Resource
	// Events records Events on Services (outlier ejections); nil in tests
	// that need none.
	Events EventCreator
}

// Resource lists, watches and gets one kind of object, as client-go's
// typed clients do. List returns the kind's list type (*v1.ServiceList);
// Get returns one object.
type Resource interface {
	List(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (runtime.Object, error)
}

// NewClient returns a Client for the API server rc points at. The three
// resources share one HTTP client and one QPS/burst rate limiter, as a
// clientset's typed clients do. Requests use rc.ContentType when it is
// set and protobuf otherwise (all three kinds have protobuf encodings;
// client-go prefers it for them too).
func NewClient(rc *rest.Config) (*Client, error) {
	c := rest.CopyConfig(rc)
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, fmt.Errorf("kube: burst %d must be positive when qps %v is", c.Burst, c.QPS)
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("kube: http client: %w", err)
	}
	core, err := restClient(c, hc, "/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	disc, err := restClient(c, hc, "/apis", discoveryv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &Client{
		Services: &restResource{c: core, resource: "services",
			newList: func() runtime.Object { return &corev1.ServiceList{} },
			newObj:  func() runtime.Object { return &corev1.Service{} }},
		EndpointSlices: &restResource{c: disc, resource: "endpointslices",
			newList: func() runtime.Object { return &discoveryv1.EndpointSliceList{} },
			newObj:  func() runtime.Object { return &discoveryv1.EndpointSlice{} }},
		Nodes: &restResource{c: core, resource: "nodes",
			newList: func() runtime.Object { return &corev1.NodeList{} },
			newObj:  func() runtime.Object { return &corev1.Node{} }},
		Events: restEvents{c: core},
	}, nil
}

func restClient(base *rest.Config, hc *http.Client, apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
	c := *base
	c.APIPath = apiPath
	c.GroupVersion = &gv
	c.NegotiatedSerializer = convert.Codecs.WithoutConversion()
	rc, err := rest.RESTClientForConfigAndClient(&c, hc)
	if err != nil {
		return nil, fmt.Errorf("kube: %s client: %w", gv, err)
	}
	return rc, nil
}

// restResource is a Resource over a REST client, cluster-wide (the source
// watches every namespace). Its requests are those of client-go's typed
// clients (gentype): the same paths, parameters and timeouts.
type restResource struct {
	c        *rest.RESTClient
	resource string
	newList  func() runtime.Object
	newObj   func() runtime.Object
}

func (r *restResource) List(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	list := r.newList()
	err := r.c.Get().UseProtobufAsDefault().Resource(r.resource).
		VersionedParams(&opts, convert.ParameterCodec).Timeout(timeout(opts)).
		Do(ctx).Into(list)
	return list, err
}

func (r *restResource) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.c.Get().UseProtobufAsDefault().Resource(r.resource).
		VersionedParams(&opts, convert.ParameterCodec).Timeout(timeout(opts)).
		Watch(ctx)
}

func (r *restResource) Get(ctx context.Context, name string, opts metav1.GetOptions) (runtime.Object, error) {
	obj := r.newObj()
	err := r.c.Get().UseProtobufAsDefault().Resource(r.resource).Name(name).
		VersionedParams(&opts, convert.ParameterCodec).
		Do(ctx).Into(obj)
	return obj, err
}

func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// ResourceFuncs is a Resource made of functions: tests adapt client-go's
// fake clientset with it. Fake clients cannot serve watch-list streams;
// WatchListUnsupported tells the informers so, as client-go's fakes do.
type ResourceFuncs struct {
	ListFunc             func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	WatchFunc            func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	GetFunc              func(ctx context.Context, name string, opts metav1.GetOptions) (runtime.Object, error)
	WatchListUnsupported bool
}

// List calls ListFunc.
func (f ResourceFuncs) List(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	return f.ListFunc(ctx, opts)
}

// Watch calls WatchFunc.
func (f ResourceFuncs) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return f.WatchFunc(ctx, opts)
}

// Get calls GetFunc.
func (f ResourceFuncs) Get(ctx context.Context, name string, opts metav1.GetOptions) (runtime.Object, error) {
	return f.GetFunc(ctx, name, opts)
}

// IsWatchListSemanticsUnSupported is client-go's marker for clients that
// cannot stream a watch list (see cache.ToListWatcherWithWatchListSemantics).
func (f ResourceFuncs) IsWatchListSemanticsUnSupported() bool { return f.WatchListUnsupported }
